//! Finding the CUDA libraries and saying which were loaded.
//!
//! cudarc (built for CUDA 13, dynamic loading) looks each library up by name: the
//! unversioned `libX.so`, then `libX.so.13`, `libX.so.12`, … on the dynamic linker's path,
//! so a CUDA 13 host (driver 580, `.so.13` libraries) and a CUDA 12 host both work. It panics
//! when none is found; [`check_libraries`] asks first, so callers get a [`GpuError`].

use std::panic::catch_unwind;

use super::GpuError;

/// Which CUDA libraries can be loaded on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaLibraries {
    /// `libcuda` (the driver).
    pub driver: bool,
    /// `libnvrtc` (run-time kernel compilation).
    pub nvrtc: bool,
    /// `libcublas` (matrix products).
    pub cublas: bool,
}

impl CudaLibraries {
    /// Probes each library by loading it (no CUDA call is made). Never panics.
    pub fn probe() -> CudaLibraries {
        // SAFETY (all three): `is_culib_present` only tries to dlopen the library by name.
        CudaLibraries {
            driver: catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() })
                .unwrap_or(false),
            nvrtc: catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
                .unwrap_or(false),
            cublas: catch_unwind(|| unsafe { cudarc::cublas::sys::is_culib_present() })
                .unwrap_or(false),
        }
    }

    /// The missing ones, named for an error ("" when none is).
    pub fn missing(&self, need_nvrtc: bool) -> String {
        let mut out = Vec::new();
        if !self.driver {
            out.push("the CUDA driver (libcuda.so.1)");
        }
        if need_nvrtc && !self.nvrtc {
            out.push("NVRTC (libnvrtc.so.13 or .12)");
        }
        if !self.cublas {
            out.push("cuBLAS (libcublas.so.13 or .12)");
        }
        out.join(", ")
    }
}

/// The libraries a GPU runner needs, or one line naming what is missing. NVRTC is not
/// needed when the kernels come precompiled ([`super::kernels::PTX_ENV`]).
pub fn check_libraries(need_nvrtc: bool) -> Result<CudaLibraries, GpuError> {
    let libs = CudaLibraries::probe();
    let missing = libs.missing(need_nvrtc);
    if missing.is_empty() {
        Ok(libs)
    } else {
        Err(GpuError::Missing { missing })
    }
}

/// A CUDA library mapped into this process, and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedLibrary {
    pub name: &'static str,
    pub path: String,
}

/// The CUDA libraries this process has loaded (from `/proc/self/maps`), for the line a
/// worker prints at start: which `.so.13` or `.so.12` files were used.
pub fn loaded_libraries() -> Vec<LoadedLibrary> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<LoadedLibrary> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let file = path.rsplit('/').next().unwrap_or(path);
        let name = if file.starts_with("libcuda.so") {
            "driver"
        } else if file.starts_with("libnvrtc.so") || file.starts_with("libnvrtc.alt.so") {
            "nvrtc"
        } else if file.starts_with("libcublasLt.so") {
            "cublasLt"
        } else if file.starts_with("libcublas.so") {
            "cublas"
        } else {
            continue;
        };
        if !out.iter().any(|l| l.path == path) {
            out.push(LoadedLibrary {
                name,
                path: path.to_owned(),
            });
        }
    }
    out
}

/// `driver=/usr/lib/…/libcuda.so.580.x nvrtc=… cublas=…`, or "none".
pub fn describe(libs: &[LoadedLibrary]) -> String {
    if libs.is_empty() {
        return "none".into();
    }
    libs.iter()
        .map(|l| format!("{}={}", l.name, l.path))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_libraries_are_named_in_one_line() {
        let none = CudaLibraries {
            driver: false,
            nvrtc: false,
            cublas: false,
        };
        assert_eq!(
            none.missing(true),
            "the CUDA driver (libcuda.so.1), NVRTC (libnvrtc.so.13 or .12), cuBLAS (libcublas.so.13 or .12)"
        );
        assert_eq!(
            none.missing(false),
            "the CUDA driver (libcuda.so.1), cuBLAS (libcublas.so.13 or .12)"
        );
        let all = CudaLibraries {
            driver: true,
            nvrtc: true,
            cublas: true,
        };
        assert_eq!(all.missing(true), "");
        let e = GpuError::Missing {
            missing: none.missing(true),
        };
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn probing_never_panics() {
        let libs = CudaLibraries::probe();
        // This process has loaded none of them before a runner exists.
        let _ = libs.missing(true);
        assert!(describe(&[]).contains("none"));
    }
}
