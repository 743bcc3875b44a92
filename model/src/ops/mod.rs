//! The forward pass's numerical building blocks: quantized and f32 dot kernels
//! ([`kernels`]), multithreaded matmuls over weights left encoded in the file
//! ([`matmul`]), paged attention ([`attention`]), row-wise math ([`math`]), f16 rounding
//! ([`half`]) and the thread pool they run on ([`pool`]).

pub mod attention;
pub mod ggml_round;
pub mod half;
mod kdot;
pub mod kernels;
pub mod math;
pub mod matmul;
pub mod pool;

pub use half::f32_to_f16;
pub use kernels::Kernels;
pub use matmul::MatmulMode;
