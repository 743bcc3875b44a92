use super::*;

#[test]
fn max_pages_leaves_headroom_and_honours_the_budget() {
    let info = DeviceInfo {
        ordinal: 0,
        name: "test".into(),
        total_bytes: 100 << 30,
        free_bytes: 90 << 30,
        compute_capability: (9, 0),
    };
    // Headroom is 2 % of 100 GiB = 2 GiB > 512 MiB.
    assert_eq!(info.usable_bytes(u64::MAX), 88 << 30);
    assert_eq!(info.max_pages_for(10 << 20, 1 << 20), 10);
    assert_eq!(info.max_pages_for(u64::MAX, 1 << 30), 88);
    let tiny = DeviceInfo {
        free_bytes: 100 << 20,
        ..info
    };
    assert_eq!(tiny.max_pages_for(u64::MAX, 1), 0);
}
