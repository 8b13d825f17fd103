"""A 4-thread allocation workload with deterministic output.

Run with PYTHONMALLOC=malloc so that every Python object comes from the C
allocator under test. Each thread builds and tears down dictionaries,
lists, strings, bytes, JSON documents, sets and object graphs; the output is
one digest per thread and must be the same with and without tlmalloc.
"""
import gc
import hashlib
import json
import queue
import re
import threading


class Node:
    __slots__ = ("key", "children", "payload")

    def __init__(self, key, payload):
        self.key = key
        self.children = []
        self.payload = payload


def work(seed, results, handoff_in, handoff_out):
    h = hashlib.sha256()
    state = seed
    for round_ in range(12):
        # dicts of strings, grown and shrunk
        d = {}
        for i in range(6000):
            state = (state * 1103515245 + 12345) & 0x7FFFFFFF
            d["k%d-%d" % (i, state % 1000)] = "v" * (state % 300)
        for k in list(d)[::3]:
            del d[k]
        h.update(str(len(d)).encode())
        # JSON round trip of a nested document
        doc = {"round": round_, "items": [{"id": i, "tags": ["t%d" % (i % 7)] * (i % 5),
                                           "v": (i * seed) % 97} for i in range(2000)]}
        text = json.dumps(doc, sort_keys=True)
        back = json.loads(text)
        h.update(hashlib.md5(text.encode()).digest())
        h.update(str(sum(item["v"] for item in back["items"])).encode())
        # sorting, sets, regular expressions
        words = [("w%d" % ((i * 7919 + seed) % 5003)) * (1 + i % 3) for i in range(8000)]
        words.sort()
        h.update(" ".join(words[::97]).encode())
        uniq = set(words)
        h.update(str(len(uniq)).encode())
        found = re.findall(r"w(\d+)3\b", " ".join(words[:3000]))
        h.update(str(len(found)).encode())
        # bytes: large buffers (large blocks) and many small ones
        big = bytearray(1_000_000 + round_ * 100_000)
        for i in range(0, len(big), 4096):
            big[i] = (i // 4096 + seed) & 0xFF
        h.update(hashlib.sha1(big).digest())
        chunks = [bytes([i & 0xFF]) * (i % 1000) for i in range(3000)]
        h.update(hashlib.sha1(b"".join(chunks)).digest())
        # an object graph with cycles, collected by the cycle collector
        nodes = [Node(i, "p" * (i % 50)) for i in range(5000)]
        for i, n in enumerate(nodes):
            n.children.append(nodes[(i * 31 + 7) % len(nodes)])
            n.children.append(nodes[(i + 1) % len(nodes)])
        h.update(str(sum(len(n.payload) for n in nodes)).encode())
        del nodes
        gc.collect()
        # objects handed to the next thread, which frees them
        handoff_out.put([("x%d" % i) * (i % 40) for i in range(2000)])
        got = handoff_in.get()
        h.update(str(sum(map(len, got))).encode())
        del got
    results[seed] = h.hexdigest()


def main():
    threads = 4
    queues = [queue.Queue() for _ in range(threads)]
    results = {}
    workers = [threading.Thread(target=work, args=(s + 1, results, queues[s], queues[(s + 1) % threads]))
               for s in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for s in sorted(results):
        print("thread %d: %s" % (s, results[s]))


main()
