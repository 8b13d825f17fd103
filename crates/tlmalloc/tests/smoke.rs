#[global_allocator]
static GLOBAL: tlmalloc::TlMalloc = tlmalloc::TlMalloc;

#[test]
fn vec_and_strings() {
    let mut v: Vec<String> = Vec::new();
    for i in 0..100_000 {
        v.push(format!("item {i}"));
    }
    assert_eq!(v[99_999], "item 99999");
    let total: usize = v.iter().map(|s| s.len()).sum();
    assert!(total > 0);
    let big = vec![7u8; 10 << 20];
    assert_eq!(big[10 << 19], 7);
    let t = std::thread::spawn(move || v.len());
    assert_eq!(t.join().unwrap(), 100_000);
}
