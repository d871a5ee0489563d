//! MD5 of several messages at once, side by side in vector lanes (multi-buffer hashing).
//!
//! MD5 is a chain of dependent 32-bit additions, rotations and bit operations: one message's
//! hash cannot go faster than that chain (~5 cycles a byte), and it was the largest single item
//! of the broker's CPU profile in the batched send path (SendMessageBatch of ten 2 KiB bodies:
//! 11.8%). Four independent messages, one per lane of a 128-bit vector, take about the time of
//! one; and since one such chain still leaves most of the CPU's vector units waiting on the
//! chain's latency, two or three registers' chains side by side (8 or 12 lanes) take little
//! more time than one. Measured on 2 KiB bodies (AMD EPYC, one core): md-5's scalar code 3.9–4.1
//! µs a body; four lanes 1.4–1.7 µs; a batch of ten 1.7 µs a body on four lanes and 1.05 µs on
//! twelve; eight bodies 1.07 µs on eight lanes.
//!
//! On x86-64 the lanes are SSE2 registers (part of the x86-64 baseline: no feature detection;
//! the intrinsics are called through one `unsafe` macro). Elsewhere they are `[u32; N]` arrays
//! that the compiler interleaves (about twice one message's speed, not four: it did not
//! vectorise the array form when tried on x86-64).
//!
//! Scheduling: the longest messages start first; up to twelve are in hand, and one that ends
//! makes room for the next at once, so lanes idle only at the end. Each pass takes the
//! narrowest lane type that holds the messages in hand (twelve lanes for more than eight, eight
//! for more than four, four for more than one); a last message finishes on the scalar path
//! (the same rounds on `u32`), which is faster than one busy lane of four.

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

    impl Word for X4 {
        #[inline(always)]
        fn splat(x: u32) -> Self {
            X4(sse2!(_mm_set1_epi32(x as i32)))
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            X4(sse2!(_mm_add_epi32(self.0, o.0)))
        }
        #[inline(always)]
        fn and(self, o: Self) -> Self {
            X4(sse2!(_mm_and_si128(self.0, o.0)))
        }
        #[inline(always)]
        fn or(self, o: Self) -> Self {
            X4(sse2!(_mm_or_si128(self.0, o.0)))
        }
        #[inline(always)]
        fn xor(self, o: Self) -> Self {
            X4(sse2!(_mm_xor_si128(self.0, o.0)))
        }
        #[inline(always)]
        fn not(self) -> Self {
            X4(sse2!(_mm_xor_si128(self.0, _mm_set1_epi32(-1))))
        }
        #[inline(always)]
        fn rotl(self, s: u32) -> Self {
            // `s` is a constant once inlined: the shifts become immediate ones.
            let l = sse2!(_mm_sll_epi32(self.0, _mm_cvtsi32_si128(s as i32)));
            let r = sse2!(_mm_srl_epi32(self.0, _mm_cvtsi32_si128(32 - s as i32)));
            X4(sse2!(_mm_or_si128(l, r)))
        }
    }

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
    }

    /// `$k` SSE2 registers side by side (`$n` = 4 × `$k` lanes), each operation done on every
    /// one: independent chains that the CPU runs in parallel.
    macro_rules! wide {
        ($name:ident, $k:expr, $n:expr) => {
            #[derive(Clone, Copy)]
            pub(super) struct $name([X4; $k]);

            impl $name {
                #[inline(always)]
                fn each(self, o: Self, f: impl Fn(X4, X4) -> X4) -> Self {
                    $name(std::array::from_fn(|r| f(self.0[r], o.0[r])))
                }
            }

            impl super::Word for $name {
                #[inline(always)]
                fn splat(x: u32) -> Self {
                    $name([X4::splat(x); $k])
                }
                #[inline(always)]
                fn add(self, o: Self) -> Self {
                    self.each(o, X4::add)
                }
                #[inline(always)]
                fn and(self, o: Self) -> Self {
                    self.each(o, X4::and)
                }
                #[inline(always)]
                fn or(self, o: Self) -> Self {
                    self.each(o, X4::or)
                }
                #[inline(always)]
                fn xor(self, o: Self) -> Self {
                    self.each(o, X4::xor)
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
                    $name(std::array::from_fn(|r| {
                        X4::from_lanes([l[4 * r], l[4 * r + 1], l[4 * r + 2], l[4 * r + 3]])
                    }))
                }
                #[inline(always)]
                fn lanes(self) -> [u32; $n] {
                    let mut out = [0u32; $n];
                    for (o, x) in out.chunks_exact_mut(4).zip(self.0) {
                        o.copy_from_slice(&x.lanes());
                    }
                    out
                }
            }
        };
    }
    wide!(X8, 2, 8);
    wide!(X12, 3, 12);
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

    fn block(&self, k: usize) -> &[u8] {
        if k < self.whole {
            &self.body[k * 64..k * 64 + 64]
        } else {
            let t = k - self.whole;
            &self.tail[t * 64..t * 64 + 64]
        }
    }
}

fn word(block: &[u8], j: usize) -> u32 {
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

/// One block of each job (at most `N`) in the lanes of `V` (an idle lane hashes zeros, and
/// its result is dropped). Not inlined: each lane type's pass is a function of its own, which
/// the compiler optimises better than the three inlined into one loop (4 lanes: ~7% faster).
#[inline(never)]
fn pass<const N: usize, V: Lanes<N>>(jobs: &mut [Job<'_>]) {
    debug_assert!(jobs.len() <= N);
    let mut words = [[0u32; N]; 16];
    let mut chain = [[0u32; N]; 4];
    for (l, job) in jobs.iter().enumerate() {
        let b = job.blocks.block(job.next);
        for (j, w) in words.iter_mut().enumerate() {
            w[l] = word(b, j);
        }
        for (c, v) in chain.iter_mut().zip(job.chain) {
            c[l] = v;
        }
    }
    let m: [V; 16] = std::array::from_fn(|j| V::from_lanes(words[j]));
    let mut state: [V; 4] = std::array::from_fn(|i| V::from_lanes(chain[i]));
    compress(&mut state, &m);
    let by_lane: [[u32; N]; 4] = std::array::from_fn(|i| state[i].lanes());
    for (l, job) in jobs.iter_mut().enumerate() {
        job.chain = std::array::from_fn(|i| by_lane[i][l]);
        job.next += 1;
    }
}

/// The widest pass: twelve lanes.
const LANES_MAX: usize = 12;

/// MD5 of each body, in input order. Up to twelve messages are in hand at once (a finished one
/// makes room for the next at once); each pass takes one block of each, on twelve lanes while
/// more than eight are in hand, eight while more than four, four while more than one; the
/// last one finishes alone.
pub fn md5_many(bodies: &[&[u8]]) -> Vec<[u8; 16]> {
    let mut out = vec![[0u8; 16]; bodies.len()];
    // Longest first, so that the long ones do not finish alone at the end.
    let mut order: Vec<usize> = (0..bodies.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(bodies[i].len()));
    let mut queue = order.into_iter();
    let mut jobs: Vec<Job<'_>> = Vec::with_capacity(LANES_MAX.min(bodies.len()));
    loop {
        while jobs.len() < LANES_MAX {
            let Some(index) = queue.next() else { break };
            jobs.push(Job {
                index,
                blocks: Blocks::new(bodies[index]),
                next: 0,
                chain: INIT,
            });
        }
        match jobs.len() {
            0 => return out,
            1 => {
                // The queue is empty (jobs were refilled above): the scalar path is faster
                // than one busy lane of four.
                let job = &jobs[0];
                out[job.index] = finish_scalar(&job.blocks, job.next, job.chain);
                return out;
            }
            2..=4 => pass::<4, X4>(&mut jobs),
            5..=8 => pass::<8, X8>(&mut jobs),
            _ => pass::<LANES_MAX, X12>(&mut jobs),
        }
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

    /// Every lane type (SSE2 on x86-64, and the arrays used elsewhere; 4, 8 and 12 lanes)
    /// compresses random blocks as the scalar rounds compress each one.
    #[test]
    fn every_lane_type_matches_the_scalar_rounds() {
        use super::Lanes;
        let seed: u64 = std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        /// Compresses one random block per lane with `V` and checks every lane against the
        /// scalar rounds.
        fn check<const N: usize, V: Lanes<N>>(
            rng: &mut impl Rng,
            what: &str,
        ) -> Result<(), String> {
            let chain: [[u32; 4]; N] = std::array::from_fn(|_| rng.gen());
            let words: [[u32; 16]; N] = std::array::from_fn(|_| rng.gen());
            let mut st: [V; 4] =
                std::array::from_fn(|i| V::from_lanes(std::array::from_fn(|l| chain[l][i])));
            let m: [V; 16] =
                std::array::from_fn(|j| V::from_lanes(std::array::from_fn(|l| words[l][j])));
            super::compress(&mut st, &m);
            let got: [[u32; N]; 4] = std::array::from_fn(|i| st[i].lanes());
            for l in 0..N {
                let mut want = chain[l];
                super::compress(&mut want, &words[l]);
                let lane: [u32; 4] = std::array::from_fn(|i| got[i][l]);
                if lane != want {
                    return Err(format!("{what}, lane {l} of {N}"));
                }
            }
            Ok(())
        }
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
        let seed: u64 = std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
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
