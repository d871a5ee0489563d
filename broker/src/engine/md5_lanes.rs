//! MD5 of several messages at once, side by side in vector lanes (multi-buffer hashing).
//!
//! MD5 is a chain of dependent 32-bit additions, rotations and bit operations: one message's
//! hash cannot go faster than that chain (~5 cycles a byte), and it was the largest single item
//! of the broker's CPU profile in the batched send path (SendMessageBatch of ten 2 KiB bodies:
//! 11.8%). Four independent messages, one per lane of a 128-bit vector, take about the time of
//! one; and since one such chain still leaves most of the CPU's vector units waiting on the
//! chain's latency, two or three registers' chains side by side take little more time than one.
//!
//! On x86-64 the lanes are SSE2 registers (part of the x86-64 baseline: no feature detection;
//! the intrinsics are called through one `unsafe` macro), and AVX2 registers (eight lanes each)
//! where the CPU has AVX2, found at run time. Elsewhere they are `[u32; N]` arrays that the
//! compiler interleaves (about twice one message's speed, not four: it did not vectorise the
//! array form when tried on x86-64).
//!
//! Measured on 2 KiB bodies (AMD EPYC with AVX2, one core): md-5's scalar code 4.1 µs a body;
//! four on SSE2 1.36 µs a body; eight on one AVX2 register 0.63 µs; ten on two AVX2 registers
//! 0.63 µs (twelve SSE2 lanes, before AVX2: 0.96 µs); sixteen 0.41 µs.
//!
//! Scheduling: the longest messages start first; up to twelve (sixteen with AVX2) are in hand,
//! and one that ends makes room for the next at once, so lanes idle only at the end. Each run
//! takes the narrowest lane type that holds the messages in hand and hashes as many blocks as
//! every one of them still has, the chaining values staying in registers from block to block;
//! a block's words are loaded sixteen bytes per lane and transposed into the lanes. A last
//! message finishes on the scalar path (the same rounds on `u32`), which is faster than one
//! busy lane of four.

/// One 32-bit word per lane.
trait Word: Copy {
    fn splat(x: u32) -> Self;
    fn add(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    fn rotl(self, s: u32) -> Self;
}

impl Word for u32 {
    #[inline(always)]
    fn splat(x: u32) -> Self {
        x
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn and(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn or(self, o: Self) -> Self {
        self | o
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        self ^ o
    }
    #[inline(always)]
    fn not(self) -> Self {
        !self
    }
    #[inline(always)]
    fn rotl(self, s: u32) -> Self {
        self.rotate_left(s)
    }
}

/// A vector of `N` lanes: a message's words go in and its chaining value comes out by lane.
trait Lanes<const N: usize>: Word {
    fn from_lanes(l: [u32; N]) -> Self;
    fn lanes(self) -> [u32; N];
    /// The sixteen message words of one block per lane (lane `l` reads `blocks[l]`).
    #[inline(always)]
    fn load(blocks: &[&[u8; 64]; N]) -> [Self; 16] {
        std::array::from_fn(|j| Self::from_lanes(std::array::from_fn(|l| word(blocks[l], j))))
    }
}

/// [`Word`] for a type wrapping one vector register, from the register's intrinsics, each run
/// through the module's `unsafe` macro `$run` (whose SAFETY comment says why the CPU has them).
#[cfg(target_arch = "x86_64")]
macro_rules! register_word {
    ($ty:ident, $run:ident, $set1:ident, $add:ident, $and:ident, $or:ident, $xor:ident,
     $sll:ident, $srl:ident) => {
        impl Word for $ty {
            #[inline(always)]
            fn splat(x: u32) -> Self {
                $ty($run!($set1(x as i32)))
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                $ty($run!($add(self.0, o.0)))
            }
            #[inline(always)]
            fn and(self, o: Self) -> Self {
                $ty($run!($and(self.0, o.0)))
            }
            #[inline(always)]
            fn or(self, o: Self) -> Self {
                $ty($run!($or(self.0, o.0)))
            }
            #[inline(always)]
            fn xor(self, o: Self) -> Self {
                $ty($run!($xor(self.0, o.0)))
            }
            #[inline(always)]
            fn not(self) -> Self {
                $ty($run!($xor(self.0, $set1(-1))))
            }
            #[inline(always)]
            fn rotl(self, s: u32) -> Self {
                // `s` is a constant once inlined: the shifts become immediate ones.
                let l = $run!($sll(self.0, _mm_cvtsi32_si128(s as i32)));
                let r = $run!($srl(self.0, _mm_cvtsi32_si128(32 - s as i32)));
                $ty($run!($or(l, r)))
            }
        }
    };
}

/// `$k` registers of type `$inner` (`$w` lanes each) side by side, `$n` = `$k` × `$w` lanes,
/// each operation done on every one: independent chains that the CPU runs in parallel.
#[cfg(target_arch = "x86_64")]
macro_rules! wide {
    ($vis:vis $name:ident, $inner:ident, $k:expr, $w:expr, $n:expr) => {
        #[derive(Clone, Copy)]
        $vis struct $name([$inner; $k]);

        impl $name {
            // Loops rather than `std::array::from_fn` here and below: `from_fn` is not always
            // inlined, and an AVX2 intrinsic outside an AVX2 function is a call, not an
            // instruction.
            #[inline(always)]
            fn each(self, o: Self, f: impl Fn($inner, $inner) -> $inner) -> Self {
                let mut out = self.0;
                for r in 0..$k {
                    out[r] = f(self.0[r], o.0[r]);
                }
                $name(out)
            }
        }

        impl Word for $name {
            #[inline(always)]
            fn splat(x: u32) -> Self {
                $name([$inner::splat(x); $k])
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.each(o, $inner::add)
            }
            #[inline(always)]
            fn and(self, o: Self) -> Self {
                self.each(o, $inner::and)
            }
            #[inline(always)]
            fn or(self, o: Self) -> Self {
                self.each(o, $inner::or)
            }
            #[inline(always)]
            fn xor(self, o: Self) -> Self {
                self.each(o, $inner::xor)
            }
            #[inline(always)]
            fn not(self) -> Self {
                self.each(self, |x, _| x.not())
            }
            #[inline(always)]
            fn rotl(self, s: u32) -> Self {
                self.each(self, |x, _| x.rotl(s))
            }
        }

        impl Lanes<$n> for $name {
            #[inline(always)]
            fn from_lanes(l: [u32; $n]) -> Self {
                let mut out = [$inner::splat(0); $k];
                for (o, part) in out.iter_mut().zip(l.chunks_exact($w)) {
                    *o = <$inner as Lanes<$w>>::from_lanes(part.try_into().expect("$w lanes"));
                }
                $name(out)
            }
            #[inline(always)]
            fn lanes(self) -> [u32; $n] {
                let mut out = [0u32; $n];
                for (o, x) in out.chunks_exact_mut($w).zip(self.0) {
                    o.copy_from_slice(&x.lanes());
                }
                out
            }
            #[inline(always)]
            fn load(blocks: &[&[u8; 64]; $n]) -> [Self; 16] {
                let mut out = [$name::splat(0); 16];
                for (r, part) in blocks.chunks_exact($w).enumerate() {
                    let words = <$inner as Lanes<$w>>::load(part.try_into().expect("$w lanes"));
                    for (o, w) in out.iter_mut().zip(words) {
                        o.0[r] = w;
                    }
                }
                out
            }
        }
    };
}

/// Four lanes in one SSE2 register.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2_lanes {
    use super::{Lanes, Word};
    use std::arch::x86_64::*;

    /// Runs SSE2 intrinsics.
    macro_rules! sse2 {
        ($e:expr) => {
            // SAFETY: the intrinsics only need the CPU to have SSE2, and the module is compiled
            // only where the target enables SSE2 (every x86-64 CPU has it: it is in the
            // x86-64 baseline). They take and return registers: no memory is touched.
            unsafe { $e }
        };
    }

    #[derive(Clone, Copy)]
    pub(super) struct X4(__m128i);

    register_word!(
        X4,
        sse2,
        _mm_set1_epi32,
        _mm_add_epi32,
        _mm_and_si128,
        _mm_or_si128,
        _mm_xor_si128,
        _mm_sll_epi32,
        _mm_srl_epi32
    );

    impl Lanes<4> for X4 {
        #[inline(always)]
        fn from_lanes(l: [u32; 4]) -> Self {
            X4(sse2!(_mm_set_epi32(
                l[3] as i32,
                l[2] as i32,
                l[1] as i32,
                l[0] as i32
            )))
        }
        #[inline(always)]
        fn lanes(self) -> [u32; 4] {
            let v = self.0;
            sse2!([
                _mm_cvtsi128_si32(v) as u32,
                _mm_cvtsi128_si32(_mm_shuffle_epi32::<0b01>(v)) as u32,
                _mm_cvtsi128_si32(_mm_shuffle_epi32::<0b10>(v)) as u32,
                _mm_cvtsi128_si32(_mm_shuffle_epi32::<0b11>(v)) as u32,
            ])
        }
        /// Four 16-byte loads per quarter block and a 4 × 4 transpose, instead of sixty-four
        /// word loads and inserts.
        #[inline(always)]
        fn load(blocks: &[&[u8; 64]; 4]) -> [Self; 16] {
            let mut out = [X4::splat(0); 16];
            for q in 0..4 {
                let r: [__m128i; 4] = std::array::from_fn(|l| {
                    let bytes: &[u8; 16] = blocks[l][16 * q..16 * q + 16]
                        .try_into()
                        .expect("16 of 64 bytes");
                    // SAFETY: `bytes` is 16 readable bytes, and loadu has no alignment
                    // requirement; SSE2 is in the x86-64 baseline.
                    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
                });
                // r[l] holds words 4q..4q+3 of lane l; out[4q + k] is word 4q+k of every lane.
                let t0 = sse2!(_mm_unpacklo_epi32(r[0], r[1]));
                let t1 = sse2!(_mm_unpacklo_epi32(r[2], r[3]));
                let t2 = sse2!(_mm_unpackhi_epi32(r[0], r[1]));
                let t3 = sse2!(_mm_unpackhi_epi32(r[2], r[3]));
                out[4 * q] = X4(sse2!(_mm_unpacklo_epi64(t0, t1)));
                out[4 * q + 1] = X4(sse2!(_mm_unpackhi_epi64(t0, t1)));
                out[4 * q + 2] = X4(sse2!(_mm_unpacklo_epi64(t2, t3)));
                out[4 * q + 3] = X4(sse2!(_mm_unpackhi_epi64(t2, t3)));
            }
            out
        }
    }

    wide!(pub(super) X8, X4, 2, 4, 8);
    wide!(pub(super) X12, X4, 3, 4, 12);
}

/// Eight lanes in one AVX2 register and sixteen in two, for CPUs that have AVX2 (found at run
/// time: it is not in the x86-64 baseline). Same scheme as SSE2's, at twice the lanes per
/// instruction.
#[cfg(target_arch = "x86_64")]
mod avx2_lanes {
    use super::{Job, Lanes, Word};
    use std::arch::x86_64::*;

    /// Proof that this CPU has AVX2: made only by [`Avx2::detect`].
    #[derive(Clone, Copy)]
    pub(super) struct Avx2(());

    impl Avx2 {
        pub(super) fn detect() -> Option<Self> {
            is_x86_feature_detected!("avx2").then_some(Avx2(()))
        }

        /// [`super::run`] on eight lanes (5–8 jobs).
        pub(super) fn run8(self, jobs: &mut [Job<'_>], blocks: usize) {
            // SAFETY: an `Avx2` exists only where the CPU has AVX2 (`detect`).
            unsafe { run8(jobs, blocks) }
        }

        /// [`super::run`] on sixteen lanes (9–16 jobs).
        pub(super) fn run16(self, jobs: &mut [Job<'_>], blocks: usize) {
            // SAFETY: as in `run8`.
            unsafe { run16(jobs, blocks) }
        }
    }

    #[target_feature(enable = "avx2")]
    #[inline(never)]
    fn run8(jobs: &mut [Job<'_>], blocks: usize) {
        super::run_inline::<8, Y8>(jobs, blocks)
    }

    #[target_feature(enable = "avx2")]
    #[inline(never)]
    fn run16(jobs: &mut [Job<'_>], blocks: usize) {
        super::run_inline::<16, Y16>(jobs, blocks)
    }

    /// Runs AVX2 intrinsics.
    macro_rules! avx2 {
        ($e:expr) => {
            // SAFETY: `Y8` and `Y16` are private to this module and are only made in `run8` and
            // `run16`, which are entered with an `Avx2` (the CPU has AVX2), and in this module's
            // test after `Avx2::detect`. The intrinsics take and return registers, except the
            // loads and stores, whose pointers are checked where they are made.
            unsafe { $e }
        };
    }

    #[derive(Clone, Copy)]
    struct Y8(__m256i);

    register_word!(
        Y8,
        avx2,
        _mm256_set1_epi32,
        _mm256_add_epi32,
        _mm256_and_si256,
        _mm256_or_si256,
        _mm256_xor_si256,
        _mm256_sll_epi32,
        _mm256_srl_epi32
    );

    impl Lanes<8> for Y8 {
        #[inline(always)]
        fn from_lanes(l: [u32; 8]) -> Self {
            let [a, b, c, d, e, f, g, h] = l.map(|x| x as i32);
            Y8(avx2!(_mm256_setr_epi32(a, b, c, d, e, f, g, h)))
        }
        #[inline(always)]
        fn lanes(self) -> [u32; 8] {
            let mut out = [0u32; 8];
            // The pointer is `out`'s 32 writable bytes; storeu has no alignment requirement.
            avx2!(_mm256_storeu_si256(out.as_mut_ptr().cast(), self.0));
            out
        }
        /// Lanes `l` and `l + 4` share a register (low and high half), and AVX2's unpacks work
        /// within halves: the same 4 × 4 transposes as SSE2's, two at a time.
        #[inline(always)]
        fn load(blocks: &[&[u8; 64]; 8]) -> [Self; 16] {
            let mut out = [Y8::splat(0); 16];
            for q in 0..4 {
                let quarter = |l: usize| -> &[u8; 16] {
                    blocks[l][16 * q..16 * q + 16]
                        .try_into()
                        .expect("16 of 64 bytes")
                };
                let mut r = [avx2!(_mm256_setzero_si256()); 4];
                for (l, x) in r.iter_mut().enumerate() {
                    let (lo, hi) = (quarter(l), quarter(l + 4));
                    // The pointers are 16 readable bytes each; loadu has no alignment
                    // requirement.
                    *x = avx2!(_mm256_set_m128i(
                        _mm_loadu_si128(hi.as_ptr().cast()),
                        _mm_loadu_si128(lo.as_ptr().cast())
                    ));
                }
                let t0 = avx2!(_mm256_unpacklo_epi32(r[0], r[1]));
                let t1 = avx2!(_mm256_unpacklo_epi32(r[2], r[3]));
                let t2 = avx2!(_mm256_unpackhi_epi32(r[0], r[1]));
                let t3 = avx2!(_mm256_unpackhi_epi32(r[2], r[3]));
                out[4 * q] = Y8(avx2!(_mm256_unpacklo_epi64(t0, t1)));
                out[4 * q + 1] = Y8(avx2!(_mm256_unpackhi_epi64(t0, t1)));
                out[4 * q + 2] = Y8(avx2!(_mm256_unpacklo_epi64(t2, t3)));
                out[4 * q + 3] = Y8(avx2!(_mm256_unpackhi_epi64(t2, t3)));
            }
            out
        }
    }

    wide!(Y16, Y8, 2, 8, 16);

    #[cfg(test)]
    mod tests {
        use rand::SeedableRng;

        #[test]
        fn avx2_lanes_match_the_scalar_rounds() {
            if super::Avx2::detect().is_none() {
                eprintln!("this CPU has no AVX2: nothing to check");
                return;
            }
            let seed = super::super::tests::seed();
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            for round in 0..200 {
                for c in [
                    super::super::tests::check::<8, super::Y8>(&mut rng, "AVX2"),
                    super::super::tests::check::<16, super::Y16>(&mut rng, "AVX2"),
                ] {
                    if let Err(e) = c {
                        panic!("{e}: seed {seed} (SLUICE_SEED), round {round}");
                    }
                }
            }
        }
    }
}

/// Lanes as an array elsewhere: the compiler interleaves them (about twice one message's speed),
/// without vector instructions. Also compiled for the tests on x86-64, which check every lane
/// type against the scalar rounds.
#[cfg(any(test, not(all(target_arch = "x86_64", target_feature = "sse2"))))]
mod array_lanes {
    #[derive(Clone, Copy)]
    pub(super) struct Arr<const N: usize>([u32; N]);

    pub(super) type X4 = Arr<4>;
    pub(super) type X8 = Arr<8>;
    pub(super) type X12 = Arr<12>;

    impl<const N: usize> Arr<N> {
        #[inline(always)]
        fn map2(self, o: Self, f: impl Fn(u32, u32) -> u32) -> Self {
            Arr(std::array::from_fn(|i| f(self.0[i], o.0[i])))
        }
    }

    impl<const N: usize> super::Lanes<N> for Arr<N> {
        #[inline(always)]
        fn from_lanes(l: [u32; N]) -> Self {
            Arr(l)
        }
        #[inline(always)]
        fn lanes(self) -> [u32; N] {
            self.0
        }
    }

    impl<const N: usize> super::Word for Arr<N> {
        #[inline(always)]
        fn splat(x: u32) -> Self {
            Arr([x; N])
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            self.map2(o, u32::wrapping_add)
        }
        #[inline(always)]
        fn and(self, o: Self) -> Self {
            self.map2(o, |x, y| x & y)
        }
        #[inline(always)]
        fn or(self, o: Self) -> Self {
            self.map2(o, |x, y| x | y)
        }
        #[inline(always)]
        fn xor(self, o: Self) -> Self {
            self.map2(o, |x, y| x ^ y)
        }
        #[inline(always)]
        fn not(self) -> Self {
            self.map2(self, |x, _| !x)
        }
        #[inline(always)]
        fn rotl(self, s: u32) -> Self {
            self.map2(self, |x, _| x.rotate_left(s))
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
use array_lanes::{X12, X4, X8};
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
use sse2_lanes::{X12, X4, X8};

/// The sine-derived additive constants, RFC 1321 §3.4.
const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

/// The initial chaining value, RFC 1321 §3.3.
const INIT: [u32; 4] = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];

/// One 64-byte block: the four rounds of sixteen steps, then the chaining addition.
#[inline(always)]
fn compress<W: Word>(state: &mut [W; 4], m: &[W; 16]) {
    let [mut a, mut b, mut c, mut d] = *state;
    macro_rules! step {
        ($f:expr, $a:ident, $b:ident, $c:ident, $d:ident, $i:expr, $g:expr, $s:expr) => {
            $a = $b.add(
                $a.add($f($b, $c, $d))
                    .add(W::splat(K[$i]))
                    .add(m[$g])
                    .rotl($s),
            );
        };
    }
    let f = |x: W, y: W, z: W| z.xor(x.and(y.xor(z)));
    let g = |x: W, y: W, z: W| y.xor(z.and(x.xor(y)));
    let h = |x: W, y: W, z: W| x.xor(y).xor(z);
    let i = |x: W, y: W, z: W| y.xor(x.or(z.not()));
    macro_rules! round {
        ($fun:ident, $base:expr, $g0:expr, $gstep:expr, [$s0:expr, $s1:expr, $s2:expr, $s3:expr]) => {
            for q in 0..4 {
                let n = $base + 4 * q;
                step!($fun, a, b, c, d, n, ($g0 + $gstep * (4 * q)) % 16, $s0);
                step!(
                    $fun,
                    d,
                    a,
                    b,
                    c,
                    n + 1,
                    ($g0 + $gstep * (4 * q + 1)) % 16,
                    $s1
                );
                step!(
                    $fun,
                    c,
                    d,
                    a,
                    b,
                    n + 2,
                    ($g0 + $gstep * (4 * q + 2)) % 16,
                    $s2
                );
                step!(
                    $fun,
                    b,
                    c,
                    d,
                    a,
                    n + 3,
                    ($g0 + $gstep * (4 * q + 3)) % 16,
                    $s3
                );
            }
        };
    }
    round!(f, 0, 0, 1, [7, 12, 17, 22]);
    round!(g, 16, 1, 5, [5, 9, 14, 20]);
    round!(h, 32, 5, 3, [4, 11, 16, 23]);
    round!(i, 48, 0, 7, [6, 10, 15, 21]);
    state[0] = state[0].add(a);
    state[1] = state[1].add(b);
    state[2] = state[2].add(c);
    state[3] = state[3].add(d);
}

/// A message cut into blocks: its whole 64-byte blocks as they lie, then the padded tail
/// (the rest, 0x80, zeros, the bit length) as one or two blocks of its own.
struct Blocks<'a> {
    body: &'a [u8],
    whole: usize,
    tail: [u8; 128],
    count: usize,
}

impl<'a> Blocks<'a> {
    fn new(body: &'a [u8]) -> Self {
        let whole = body.len() / 64;
        let rest = &body[whole * 64..];
        let mut tail = [0u8; 128];
        tail[..rest.len()].copy_from_slice(rest);
        tail[rest.len()] = 0x80;
        // The length field needs 8 bytes after the 0x80: one block if the rest leaves room.
        let tail_blocks = if rest.len() + 1 + 8 <= 64 { 1 } else { 2 };
        let bits = (body.len() as u64).wrapping_mul(8);
        tail[tail_blocks * 64 - 8..tail_blocks * 64].copy_from_slice(&bits.to_le_bytes());
        Blocks {
            body,
            whole,
            tail,
            count: whole + tail_blocks,
        }
    }

    fn block(&self, k: usize) -> &[u8; 64] {
        let b = if k < self.whole {
            &self.body[k * 64..k * 64 + 64]
        } else {
            let t = k - self.whole;
            &self.tail[t * 64..t * 64 + 64]
        };
        b.try_into().expect("a block is 64 bytes")
    }
}

fn word(block: &[u8; 64], j: usize) -> u32 {
    u32::from_le_bytes([
        block[4 * j],
        block[4 * j + 1],
        block[4 * j + 2],
        block[4 * j + 3],
    ])
}

fn digest_of(state: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, s) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    out
}

/// Finishes one message on the scalar path, from block `from` with chaining value `state`.
fn finish_scalar(blocks: &Blocks<'_>, from: usize, mut state: [u32; 4]) -> [u8; 16] {
    for k in from..blocks.count {
        let b = blocks.block(k);
        let m: [u32; 16] = std::array::from_fn(|j| word(b, j));
        compress(&mut state, &m);
    }
    digest_of(state)
}

/// MD5 of one message on the scalar path (the tests check it against the RFC's vectors).
#[cfg(test)]
fn md5(body: &[u8]) -> [u8; 16] {
    finish_scalar(&Blocks::new(body), 0, INIT)
}

/// A lane's message: its index in the input, its blocks, the next block to hash and its
/// chaining value so far.
struct Job<'a> {
    index: usize,
    blocks: Blocks<'a>,
    next: usize,
    chain: [u32; 4],
}

/// `blocks` blocks of each job (at most `N`; each has that many left) in the lanes of `V`,
/// the chaining values staying in registers from one block to the next (an idle lane hashes
/// zeros, and its result is dropped). Not inlined: each lane type's run is a function of its
/// own, which the compiler optimises better than several inlined into one loop.
#[inline(never)]
fn run<const N: usize, V: Lanes<N>>(jobs: &mut [Job<'_>], blocks: usize) {
    run_inline::<N, V>(jobs, blocks)
}

/// [`run`]'s body, inlined into the callers that enable more CPU features (AVX2).
#[inline(always)]
fn run_inline<const N: usize, V: Lanes<N>>(jobs: &mut [Job<'_>], blocks: usize) {
    debug_assert!(jobs.len() <= N);
    const ZEROS: [u8; 64] = [0; 64];
    let mut chain = [[0u32; N]; 4];
    for (l, job) in jobs.iter().enumerate() {
        debug_assert!(job.next + blocks <= job.blocks.count);
        for (c, v) in chain.iter_mut().zip(job.chain) {
            c[l] = v;
        }
    }
    let mut state: [V; 4] = std::array::from_fn(|i| V::from_lanes(chain[i]));
    for k in 0..blocks {
        let b: [&[u8; 64]; N] = std::array::from_fn(|l| match jobs.get(l) {
            Some(job) => job.blocks.block(job.next + k),
            None => &ZEROS,
        });
        compress(&mut state, &V::load(&b));
    }
    let by_lane: [[u32; N]; 4] = std::array::from_fn(|i| state[i].lanes());
    for (l, job) in jobs.iter_mut().enumerate() {
        job.chain = std::array::from_fn(|i| by_lane[i][l]);
        job.next += blocks;
    }
}

/// Messages in hand at once: twelve lanes (three SSE2 registers, or arrays)...
const LANES_MAX_BASE: usize = 12;
/// ... or sixteen (two AVX2 registers), where the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
const LANES_MAX_AVX2: usize = 16;

/// MD5 of each body, in input order. Up to twelve messages (sixteen with AVX2) are in hand at
/// once, and a finished one makes room for the next at once. Each run hashes the blocks that
/// every message in hand still has, on the narrowest lane type that holds them all; the last
/// message finishes alone on the scalar path.
pub fn md5_many(bodies: &[&[u8]]) -> Vec<[u8; 16]> {
    let mut out = vec![[0u8; 16]; bodies.len()];
    // Longest first, so that the long ones do not finish alone at the end.
    let mut order: Vec<usize> = (0..bodies.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(bodies[i].len()));
    let mut queue = order.into_iter();
    let wide = Wide::detect();
    let in_hand = wide.lanes_max();
    let mut jobs: Vec<Job<'_>> = Vec::with_capacity(in_hand.min(bodies.len()));
    loop {
        while jobs.len() < in_hand {
            let Some(index) = queue.next() else { break };
            jobs.push(Job {
                index,
                blocks: Blocks::new(bodies[index]),
                next: 0,
                chain: INIT,
            });
        }
        if jobs.len() == 1 {
            // The queue is empty (jobs were refilled above): the scalar path is faster than
            // one busy lane of four.
            let job = &jobs[0];
            out[job.index] = finish_scalar(&job.blocks, job.next, job.chain);
            return out;
        }
        let Some(blocks) = jobs.iter().map(|j| j.blocks.count - j.next).min() else {
            return out;
        };
        wide.run(&mut jobs, blocks);
        let mut k = 0;
        while k < jobs.len() {
            if jobs[k].next == jobs[k].blocks.count {
                let job = jobs.swap_remove(k);
                out[job.index] = digest_of(job.chain);
            } else {
                k += 1;
            }
        }
    }
}

/// The lane types this CPU runs: AVX2 registers if it has them, else SSE2 (or arrays).
#[derive(Clone, Copy)]
enum Wide {
    Base,
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2_lanes::Avx2),
}

impl Wide {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = avx2_lanes::Avx2::detect() {
            return Wide::Avx2(a);
        }
        Wide::Base
    }

    /// Messages in hand at once.
    fn lanes_max(self) -> usize {
        match self {
            Wide::Base => LANES_MAX_BASE,
            #[cfg(target_arch = "x86_64")]
            Wide::Avx2(_) => LANES_MAX_AVX2,
        }
    }

    /// `blocks` blocks of each of 2..=`lanes_max()` jobs, on the narrowest lanes that hold them.
    fn run(self, jobs: &mut [Job<'_>], blocks: usize) {
        match (self, jobs.len()) {
            (_, 0..=4) => run::<4, X4>(jobs, blocks),
            #[cfg(target_arch = "x86_64")]
            (Wide::Avx2(a), 5..=8) => a.run8(jobs, blocks),
            #[cfg(target_arch = "x86_64")]
            (Wide::Avx2(a), _) => a.run16(jobs, blocks),
            (Wide::Base, 5..=8) => run::<8, X8>(jobs, blocks),
            (Wide::Base, _) => run::<LANES_MAX_BASE, X12>(jobs, blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use md5::{Digest, Md5};
    use rand::{Rng, SeedableRng};

    fn reference(b: &[u8]) -> [u8; 16] {
        Md5::digest(b).into()
    }

    #[test]
    fn rfc_1321_test_suite() {
        // RFC 1321 appendix A.5.
        let cases: [(&str, &str); 7] = [
            ("", "d41d8cd98f00b204e9800998ecf8427e"),
            ("a", "0cc175b9c0f1b6a831c399e269772661"),
            ("abc", "900150983cd24fb0d6963f7d28e17f72"),
            ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "c3fcd3d76192e4007dfb496cca67e13b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "d174ab98d277d9f5a5611c2c9f419d9f",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ];
        let hex = |d: [u8; 16]| super::super::md5::hex16(&d).to_vec();
        let bodies: Vec<&[u8]> = cases.iter().map(|(m, _)| m.as_bytes()).collect();
        let many = super::md5_many(&bodies);
        for ((m, want), got) in cases.iter().zip(many) {
            assert_eq!(hex(super::md5(m.as_bytes())), want.as_bytes(), "{m:?}");
            assert_eq!(hex(got), want.as_bytes(), "{m:?} in a batch");
        }
    }

    #[test]
    fn every_length_around_the_padding_edges() {
        // Lengths 0..=200 cover rests of 0..63 bytes with one and two tail blocks.
        let data: Vec<u8> = (0..200u32).map(|i| (i * 31 + 7) as u8).collect();
        let bodies: Vec<&[u8]> = (0..=200).map(|n| &data[..n]).collect();
        let many = super::md5_many(&bodies);
        for (b, got) in bodies.iter().zip(many) {
            assert_eq!(super::md5(b), reference(b), "scalar, {} bytes", b.len());
            assert_eq!(got, reference(b), "in a batch, {} bytes", b.len());
        }
    }

    /// The test seed: `SLUICE_SEED`, else random (printed by the failing assertion).
    pub(super) fn seed() -> u64 {
        std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random)
    }

    /// Loads one random block per lane into `V`, compresses it from a random chaining value
    /// and checks every lane against the scalar rounds on that lane's block.
    pub(super) fn check<const N: usize, V: super::Lanes<N>>(
        rng: &mut impl Rng,
        what: &str,
    ) -> Result<(), String> {
        let chain: [[u32; 4]; N] = std::array::from_fn(|_| rng.gen());
        let blocks: [[u8; 64]; N] = std::array::from_fn(|_| std::array::from_fn(|_| rng.gen()));
        let mut st: [V; 4] =
            std::array::from_fn(|i| V::from_lanes(std::array::from_fn(|l| chain[l][i])));
        let m = V::load(&std::array::from_fn(|l| &blocks[l]));
        super::compress(&mut st, &m);
        let got: [[u32; N]; 4] = std::array::from_fn(|i| st[i].lanes());
        for l in 0..N {
            let mut want = chain[l];
            let words: [u32; 16] = std::array::from_fn(|j| super::word(&blocks[l], j));
            super::compress(&mut want, &words);
            let lane: [u32; 4] = std::array::from_fn(|i| got[i][l]);
            if lane != want {
                return Err(format!("{what}, lane {l} of {N}"));
            }
        }
        Ok(())
    }

    /// Every lane type (SSE2 on x86-64, and the arrays used elsewhere; 4, 8 and 12 lanes) loads
    /// and compresses random blocks as the scalar rounds do each one. AVX2's are checked in
    /// their module.
    #[test]
    fn every_lane_type_matches_the_scalar_rounds() {
        let seed = seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for round in 0..200 {
            let checks = [
                check::<4, super::array_lanes::X4>(&mut rng, "array lanes"),
                check::<8, super::array_lanes::X8>(&mut rng, "array lanes"),
                check::<12, super::array_lanes::X12>(&mut rng, "array lanes"),
                check::<4, super::X4>(&mut rng, "lanes in use"),
                check::<8, super::X8>(&mut rng, "lanes in use"),
                check::<12, super::X12>(&mut rng, "lanes in use"),
            ];
            for c in checks {
                if let Err(e) = c {
                    panic!("{e}: seed {seed} (SLUICE_SEED), round {round}");
                }
            }
        }
    }

    #[test]
    fn random_batches_match_the_reference() {
        let seed = seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for round in 0..300 {
            let n = rng.gen_range(0..=30);
            let bodies: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = match rng.gen_range(0..4) {
                        0 => rng.gen_range(0..130),
                        1 => 2048,
                        _ => rng.gen_range(0..5000),
                    };
                    (0..len).map(|_| rng.gen()).collect()
                })
                .collect();
            let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_slice()).collect();
            let many = super::md5_many(&refs);
            assert_eq!(many.len(), n);
            for (i, (b, got)) in bodies.iter().zip(many).enumerate() {
                assert_eq!(
                    got,
                    reference(b),
                    "seed {seed} (SLUICE_SEED), round {round}, body {i} of {n}, {} bytes",
                    b.len()
                );
            }
        }
    }
}
