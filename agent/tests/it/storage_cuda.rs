//! CUDA page memory. On a host without a driver (CI, the project VM) the GPU tests print
//! "skipped: no CUDA driver" and pass, and the no-driver test checks the error instead.
//! On a GPU host (`agent/gpu-check`) they run for real.

use den_agent::engine::SyntheticKv;
use den_agent::memory::cuda::{self, CudaOptions};
use den_agent::memory::{
    ArenaGeometry, CudaMemory, Direction, Gathered, HostMemory, MemoryError, PageMemory, RowRun,
    TimingSource,
};
use den_protocol::ids::ModelFingerprint;

fn geometry() -> ArenaGeometry {
    // 16-token pages of 4 KiB rows: 64 KiB pages, 256 pages = 16 MiB.
    ArenaGeometry::new(16, 256, 4096).unwrap()
}

/// Opens GPU 0. These tests are ignored unless asked for (`--ignored`, as agent/gpu-check
/// does), and then a missing driver or GPU is a failure, not a skip.
fn open_gpu(options: CudaOptions) -> CudaMemory {
    assert!(
        cuda::driver_present(),
        "no CUDA driver (libcuda) on this host"
    );
    match cuda::device_count() {
        Ok(0) | Err(_) => panic!("CUDA driver present but no usable GPU"),
        Ok(_) => {}
    }
    match CudaMemory::open_with(0, geometry(), options) {
        Ok(m) => m,
        Err(e) => panic!("a GPU is present but the cuda backend failed to open: {e}"),
    }
}

#[test]
fn cuda_open_without_driver_is_a_clear_error_not_a_panic() {
    if cuda::driver_present() {
        // With a driver, the clear error to check is a GPU that does not exist.
        let e = CudaMemory::open(999, geometry())
            .err()
            .expect("there is no GPU 999");
        assert!(e.to_string().contains("GPU 999 does not exist"), "{e}");
        println!("driver present: checked the missing-GPU error instead: {e}");
        return;
    }
    let e = CudaMemory::open(0, geometry())
        .err()
        .expect("no driver, so no arena");
    assert_eq!(e, MemoryError::NoDriver);
    let msg = e.to_string();
    assert_eq!(
        msg,
        "cuda backend: no CUDA driver (libcuda.so) found on this host; use --backend host"
    );
    assert_eq!(cuda::probe(0).unwrap_err(), MemoryError::NoDriver);
    assert_eq!(cuda::device_count().unwrap_err(), MemoryError::NoDriver);
}

#[test]
#[ignore = "needs a CUDA GPU: agent/gpu-check runs it"]
fn cuda_round_trip_across_non_contiguous_pages() {
    let mut m = open_gpu(CudaOptions::default());
    println!("{}", m.describe());
    let g = m.geometry();
    let model = ModelFingerprint::from("gpu-check");
    let kv = SyntheticKv::new(&model);
    // A 40-token chunk starting mid-page, scattered over pages 200, 7, 8 (contiguous) and 3.
    let route = [200, 7, 8, 3];
    let runs = g.runs_for(&route, 10, 40).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| 500 + i).collect();
    let rows = kv.rows(10, &tokens, g.row_bytes as usize);
    let w = m.write_runs(&runs, &rows).unwrap();
    assert_eq!(
        (w.bytes, w.direction, w.timing),
        (
            rows.len() as u64,
            Direction::Upload,
            TimingSource::CudaEvents
        )
    );
    assert_eq!(
        w.copies, 3,
        "pages 7 and 8 are contiguous and merge into one copy"
    );
    let mut back = vec![0u8; rows.len()];
    let r = m.read_runs(&runs, &mut back).unwrap();
    assert_eq!(r.direction, Direction::Download);
    kv.verify_rows(10, &tokens, &back).unwrap();
    // Copy-on-write of the partial tail page 3, then diverge the copy.
    m.copy_page(3, 100).unwrap();
    let tail = [RowRun {
        page: 100,
        offset: 0,
        len: 2,
    }];
    let mut copied = vec![0u8; 2 * g.row_bytes as usize];
    m.read_runs(&tail, &mut copied).unwrap();
    kv.verify_rows(48, &tokens[38..40], &copied).unwrap();
    m.write_runs(
        &[RowRun {
            page: 100,
            offset: 2,
            len: 1,
        }],
        &kv.row(44, 9, g.row_bytes as usize),
    )
    .unwrap();
    let mut original = vec![0u8; rows.len()];
    m.read_runs(&runs, &mut original).unwrap();
    assert_eq!(
        original, rows,
        "writing the copy must not touch the original page"
    );
    let t = m.totals();
    assert_eq!(t.upload.count, 2);
    assert!(t.upload.bytes_per_ms.value.is_some());
    println!(
        "upload {:.2} GB/s, download {:.2} GB/s (16 MiB arena, small runs)",
        w.gb_per_s().unwrap_or(0.0),
        r.gb_per_s().unwrap_or(0.0)
    );
}

#[test]
#[ignore = "needs a CUDA GPU: agent/gpu-check runs it"]
fn cuda_a_write_left_in_flight_lands_before_anything_reads_it() {
    // A small staging buffer (4 rows), so a 40-row write runs as several batches and only
    // the last is left in flight; the rows come in three pieces split mid-row, gathered
    // into the staging. `settle` reports the whole write once; a read issued without
    // settling sees the rows too (it settles first), as does a second started write,
    // which settles the first before reusing the staging.
    let mut m = open_gpu(CudaOptions {
        staging_bytes: 4 * 4096,
    });
    let g = m.geometry();
    let kv = SyntheticKv::new(&ModelFingerprint::from("gpu-check"));
    let route = [9, 200, 3];
    let runs = g.runs_for(&route, 5, 40).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| 900 + i).collect();
    let rows = kv.rows(5, &tokens, g.row_bytes as usize);
    let (a, rest) = rows.split_at(4096 * 3 + 100);
    let (b, c) = rest.split_at(4096 * 20);
    m.start_write(&runs, Gathered(&[a, b, c])).unwrap();
    let settled = m.settle().unwrap().expect("the write was in flight");
    assert_eq!(
        (settled.bytes, settled.direction),
        (rows.len() as u64, Direction::Upload)
    );
    assert!(m.settle().unwrap().is_none(), "nothing is left in flight");
    let mut back = vec![0u8; rows.len()];
    m.read_runs(&runs, &mut back).unwrap();
    kv.verify_rows(5, &tokens, &back).unwrap();

    let other: Vec<u32> = (0..40).map(|i| 3000 + i).collect();
    let rows2 = kv.rows(5, &other, g.row_bytes as usize);
    m.start_write(&runs, Gathered(&[&rows])).unwrap();
    m.start_write(&runs, Gathered(&[&rows2])).unwrap();
    let mut back = vec![0u8; rows2.len()];
    m.read_runs(&runs, &mut back).unwrap();
    kv.verify_rows(5, &other, &back).unwrap();
    assert_eq!(m.totals().upload.count, 3, "every write counted once");
}

#[test]
#[ignore = "needs a CUDA GPU: agent/gpu-check runs it"]
fn cuda_small_staging_splits_batches_and_matches_host_backend() {
    let mut gpu = open_gpu(CudaOptions {
        staging_bytes: 100_000,
    });
    let mut host = HostMemory::open(geometry()).unwrap();
    let g = geometry();
    let kv = SyntheticKv::new(&ModelFingerprint::from("m"));
    let pages: Vec<u32> = (0..64).map(|i| (i * 37) % 256).collect();
    let runs = g.runs_for(&pages, 5, 1000).unwrap();
    let tokens: Vec<u32> = (0..1000).collect();
    let rows = kv.rows(5, &tokens, g.row_bytes as usize);
    let w = gpu.write_runs(&runs, &rows).unwrap();
    host.write_runs(&runs, &rows).unwrap();
    assert!(
        w.copies as usize >= rows.len() / 100_000,
        "4 MB through 100 kB staging needs many copies"
    );
    let all: Vec<RowRun> = (0..256)
        .map(|p| RowRun {
            page: p,
            offset: 0,
            len: 16,
        })
        .collect();
    let mut a = vec![0u8; g.arena_bytes() as usize];
    let mut b = vec![1u8; g.arena_bytes() as usize];
    gpu.read_runs(&all, &mut a).unwrap();
    host.read_runs(&all, &mut b).unwrap();
    assert!(
        a == b,
        "device and host arenas differ after identical writes"
    );
    assert!(gpu.max_pages_for(u64::MAX) > 0);
    let info = gpu.info();
    assert!(!info.name.is_empty() && info.total_bytes > 0);
}

#[test]
#[ignore = "needs a CUDA GPU: agent/gpu-check runs it"]
fn cuda_rejects_bad_runs_like_the_host_backend() {
    let mut m = open_gpu(CudaOptions::default());
    let bad = [RowRun {
        page: 256,
        offset: 0,
        len: 1,
    }];
    assert!(matches!(
        m.write_runs(&bad, &[0u8; 4096]),
        Err(MemoryError::PageOutOfRange { page: 256, .. })
    ));
    assert!(matches!(
        m.copy_page(0, 999),
        Err(MemoryError::PageOutOfRange { .. })
    ));
}
