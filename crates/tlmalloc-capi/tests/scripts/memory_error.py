"""MemoryError, caught, again and again: run under `ulimit -v` (an
address-space limit a few hundred MiB above the interpreter's start) with
libtlmalloc.so preloaded and PYTHONMALLOC=malloc, so that every Python
object comes from tlmalloc and every refusal is a real mmap failing.

Each round grows bytearrays, lists and bytes until the interpreter raises
MemoryError, catches it, frees everything and checks that ordinary work
still runs; the last line is "OK <rounds> <errors>" when every round hit
the limit and recovered.

    python3 memory_error.py ROUNDS
"""
import sys

MIB = 1 << 20


def fill_until_memory_error(kind):
    """Allocate ever larger objects of `kind` (kept alive) until the
    interpreter runs out of memory; returns how many it got."""
    held = []
    size = MIB
    try:
        while True:
            if kind == "bytearray":
                held.append(bytearray(size))
            elif kind == "list":
                held.append([None] * (size // 8))
            elif kind == "bytes":
                held.append(b"x" * size)
            else:  # many small objects: dicts of strings
                held.append([{"k%d" % i: str(i)} for i in range(size // 256)])
            size = min(size * 2, 64 * MIB)
    except MemoryError:
        got = len(held)
        del held
        return got


def ordinary_work(round_):
    d = {str(i): [i] * 10 for i in range(2000)}
    s = sum(len(v) for v in d.values())
    text = ",".join(str(i * round_) for i in range(5000))
    return s == 20000 and len(text.split(",")) == 5000


def main():
    rounds = int(sys.argv[1])
    errors = 0
    for round_ in range(rounds):
        kind = ("bytearray", "list", "bytes", "small")[round_ % 4]
        got = fill_until_memory_error(kind)
        if got is None:
            print("round %d: no MemoryError with %s" % (round_, kind))
            break
        errors += 1
        if not ordinary_work(round_):
            print("round %d: wrong results after MemoryError" % round_)
            break
        print("round %d: %s: %d objects, then MemoryError" % (round_, kind, got))
    # After the last round: a large block must be served again.
    big = bytearray(32 * MIB)
    big[-1] = 1
    print("OK %d %d" % (rounds, errors) if errors == rounds else "FAILED %d %d" % (rounds, errors))


main()
