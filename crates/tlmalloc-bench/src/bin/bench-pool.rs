//! `tlmalloc::Pool<T>` against `Box<T>` (both on tlmalloc as the global
//! allocator), for a 48-byte and a 2000-byte object.
//!
//! ```text
//! bench-pool time [ITERS]              # interleaved runs, medians of 7, ns per alloc+drop
//! bench-pool pair box|pool|empty SIZE ITERS   # one loop, for callgrind (no timing)
//! ```
//!
//! Instructions per pair: `valgrind --tool=callgrind` on `pair K 48 100000`
//! and `pair K 48 200000`, difference / 100000, minus the same for `empty`.

use std::hint::black_box;
use std::time::Instant;

use tlmalloc::Pool;

#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

/// 48 bytes (the contents are written, and observed through `black_box`).
#[allow(dead_code)]
struct Small([u64; 6]);
/// 2000 bytes.
#[allow(dead_code)]
struct Big([u64; 250]);

impl Default for Small {
    fn default() -> Self {
        Small([7; 6])
    }
}

impl Default for Big {
    fn default() -> Self {
        Big([7; 250])
    }
}

static SMALL: Pool<Small> = Pool::new();
static BIG: Pool<Big> = Pool::new();

#[inline(never)]
fn box_loop<T: Default>(iters: u64) -> usize {
    let mut check = 0usize;
    for _ in 0..iters {
        let b = black_box(Box::new(T::default()));
        check = check.wrapping_add(&*b as *const T as usize);
    }
    check
}

#[inline(never)]
fn pool_loop<T: Default + 'static>(pool: &'static Pool<T>, iters: u64) -> usize {
    let mut check = 0usize;
    for _ in 0..iters {
        let b = black_box(pool.alloc(T::default()));
        check = check.wrapping_add(&*b as *const T as usize);
    }
    check
}

#[inline(never)]
fn empty_loop<T: Default>(iters: u64) -> usize {
    let mut check = 0usize;
    for _ in 0..iters {
        let v = black_box(T::default());
        check = check.wrapping_add(&v as *const T as usize);
    }
    check
}

fn run(kind: &str, size: usize, iters: u64) -> usize {
    match (kind, size) {
        ("box", 48) => box_loop::<Small>(iters),
        ("pool", 48) => pool_loop(&SMALL, iters),
        ("empty", 48) => empty_loop::<Small>(iters),
        ("box", 2000) => box_loop::<Big>(iters),
        ("pool", 2000) => pool_loop(&BIG, iters),
        ("empty", 2000) => empty_loop::<Big>(iters),
        _ => {
            eprintln!("usage: bench-pool time [ITERS] | pair box|pool|empty 48|2000 ITERS");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("pair") if args.len() == 5 => {
            let size = args[3].parse().unwrap_or(0);
            let iters = args[4].parse().unwrap_or(0);
            println!("{}", run(&args[2], size, iters));
        }
        Some("time") => {
            let iters = args
                .get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(10_000_000u64);
            println!("| size | Box ns/pair | Pool ns/pair | Pool / Box |");
            println!("|---:|---:|---:|---:|");
            for size in [48, 2000] {
                run("box", size, iters / 10);
                run("pool", size, iters / 10);
                let mut times = [Vec::new(), Vec::new()];
                for _ in 0..7 {
                    for (i, kind) in ["box", "pool"].iter().enumerate() {
                        let t = Instant::now();
                        black_box(run(kind, size, iters));
                        times[i].push(t.elapsed().as_nanos() as f64 / iters as f64);
                    }
                }
                let median = |v: &mut Vec<f64>| {
                    v.sort_by(|a, b| a.total_cmp(b));
                    v[v.len() / 2]
                };
                let (b, p) = (median(&mut times[0]), median(&mut times[1]));
                println!("| {size} | {b:.2} | {p:.2} | {:.2}× |", p / b);
            }
        }
        _ => {
            eprintln!("usage: bench-pool time [ITERS] | pair box|pool|empty 48|2000 ITERS");
            std::process::exit(2);
        }
    }
}
