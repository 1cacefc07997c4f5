//! XXH3-64 with a seed (std only), enough for kvspec's block hashes:
//! `local_hash` is XXH3-64 (seed 1337) over a page's token ids as
//! little-endian u32, `chain_hash` XXH3-64 (seed 1337) over the parent's
//! sequence hash and the page's local hash as little-endian u64 (SPEC.md,
//! "Hashing"). Written from the published XXH3 algorithm description; every
//! input length class is covered (a page of 64 tokens is 256 bytes: the long
//! path).

const P32_1: u64 = 0x9E37_79B1;
const P32_2: u64 = 0x85EB_CA77;
const P32_3: u64 = 0xC2B2_AE3D;
const P64_1: u64 = 0x9E37_79B1_85EB_CA87;
const P64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P64_3: u64 = 0x1656_67B1_9E37_79F9;
const P64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const P64_5: u64 = 0x27D4_EB2F_1656_67C5;
const PMX_1: u64 = 0x1656_6791_9E37_79F9;
const PMX_2: u64 = 0x9FB2_1C65_1E98_DF25;

pub const SEED: u64 = 1337;

const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d,
    0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0,
    0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,
    0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,
    0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac,
    0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51,
    0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,
    0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49,
    0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,
    0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b,
    0x40, 0x7e,
];

fn rd64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn rd32(b: &[u8], at: usize) -> u64 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as u64
}

fn mul_fold(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

fn avalanche_xxh64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(P64_2);
    h ^= h >> 29;
    h = h.wrapping_mul(P64_3);
    h ^ (h >> 32)
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(PMX_1);
    h ^ (h >> 32)
}

fn rrmxmx(mut h: u64, len: u64) -> u64 {
    h ^= h.rotate_left(49) ^ h.rotate_left(24);
    h = h.wrapping_mul(PMX_2);
    h ^= (h >> 35).wrapping_add(len);
    h = h.wrapping_mul(PMX_2);
    h ^ (h >> 28)
}

fn mix16(input: &[u8], at: usize, sec: &[u8], s: usize, seed: u64) -> u64 {
    let lo = rd64(input, at) ^ rd64(sec, s).wrapping_add(seed);
    let hi = rd64(input, at + 8) ^ rd64(sec, s + 8).wrapping_sub(seed);
    mul_fold(lo, hi)
}

pub fn xxh3_64(input: &[u8], seed: u64) -> u64 {
    let len = input.len();
    let k = &SECRET[..];
    let n = len as u64;
    if len == 0 {
        return avalanche_xxh64(seed ^ (rd64(k, 56) ^ rd64(k, 64)));
    }
    if len <= 3 {
        let c1 = input[0] as u32;
        let c2 = input[len >> 1] as u32;
        let c3 = input[len - 1] as u32;
        let combined = (c1 << 16) | (c2 << 24) | c3 | ((len as u32) << 8);
        let bitflip = (rd32(k, 0) ^ rd32(k, 4)).wrapping_add(seed);
        return avalanche_xxh64((combined as u64) ^ bitflip);
    }
    if len <= 8 {
        let seed = seed ^ (((seed as u32).swap_bytes() as u64) << 32);
        let in1 = rd32(input, 0);
        let in2 = rd32(input, len - 4);
        let bitflip = (rd64(k, 8) ^ rd64(k, 16)).wrapping_sub(seed);
        let input64 = in2.wrapping_add(in1 << 32);
        return rrmxmx(input64 ^ bitflip, n);
    }
    if len <= 16 {
        let bitflip1 = (rd64(k, 24) ^ rd64(k, 32)).wrapping_add(seed);
        let bitflip2 = (rd64(k, 40) ^ rd64(k, 48)).wrapping_sub(seed);
        let lo = rd64(input, 0) ^ bitflip1;
        let hi = rd64(input, len - 8) ^ bitflip2;
        let acc = n.wrapping_add(lo.swap_bytes()).wrapping_add(hi).wrapping_add(mul_fold(lo, hi));
        return avalanche(acc);
    }
    if len <= 128 {
        let mut acc = n.wrapping_mul(P64_1);
        if len > 32 {
            if len > 64 {
                if len > 96 {
                    acc = acc.wrapping_add(mix16(input, 48, k, 96, seed));
                    acc = acc.wrapping_add(mix16(input, len - 64, k, 112, seed));
                }
                acc = acc.wrapping_add(mix16(input, 32, k, 64, seed));
                acc = acc.wrapping_add(mix16(input, len - 48, k, 80, seed));
            }
            acc = acc.wrapping_add(mix16(input, 16, k, 32, seed));
            acc = acc.wrapping_add(mix16(input, len - 32, k, 48, seed));
        }
        acc = acc.wrapping_add(mix16(input, 0, k, 0, seed));
        acc = acc.wrapping_add(mix16(input, len - 16, k, 16, seed));
        return avalanche(acc);
    }
    if len <= 240 {
        let mut acc = n.wrapping_mul(P64_1);
        for i in 0..8 {
            acc = acc.wrapping_add(mix16(input, 16 * i, k, 16 * i, seed));
        }
        acc = avalanche(acc);
        for i in 8..len / 16 {
            acc = acc.wrapping_add(mix16(input, 16 * i, k, 16 * (i - 8) + 3, seed));
        }
        acc = acc.wrapping_add(mix16(input, len - 16, k, 136 - 17, seed));
        return avalanche(acc);
    }
    hash_long(input, seed)
}

fn accumulate_512(acc: &mut [u64; 8], input: &[u8], at: usize, sec: &[u8], s: usize) {
    for i in 0..8 {
        let data = rd64(input, at + 8 * i);
        let key = data ^ rd64(sec, s + 8 * i);
        acc[i ^ 1] = acc[i ^ 1].wrapping_add(data);
        acc[i] = acc[i].wrapping_add((key & 0xFFFF_FFFF).wrapping_mul(key >> 32));
    }
}

fn scramble(acc: &mut [u64; 8], sec: &[u8], s: usize) {
    for (i, a) in acc.iter_mut().enumerate() {
        let mut v = *a;
        v ^= v >> 47;
        v ^= rd64(sec, s + 8 * i);
        *a = v.wrapping_mul(P32_1);
    }
}

fn hash_long(input: &[u8], seed: u64) -> u64 {
    let mut sec = [0u8; 192];
    for i in 0..12 {
        let lo = rd64(&SECRET, 16 * i).wrapping_add(seed);
        let hi = rd64(&SECRET, 16 * i + 8).wrapping_sub(seed);
        sec[16 * i..16 * i + 8].copy_from_slice(&lo.to_le_bytes());
        sec[16 * i + 8..16 * i + 16].copy_from_slice(&hi.to_le_bytes());
    }
    let len = input.len();
    let mut acc: [u64; 8] = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
    let stripes_per_block = (192 - 64) / 8;
    let block_len = 64 * stripes_per_block;
    let blocks = (len - 1) / block_len;
    for b in 0..blocks {
        for st in 0..stripes_per_block {
            accumulate_512(&mut acc, input, b * block_len + 64 * st, &sec, 8 * st);
        }
        scramble(&mut acc, &sec, 192 - 64);
    }
    let stripes = ((len - 1) - block_len * blocks) / 64;
    for st in 0..stripes {
        accumulate_512(&mut acc, input, blocks * block_len + 64 * st, &sec, 8 * st);
    }
    accumulate_512(&mut acc, input, len - 64, &sec, 192 - 64 - 7);
    let mut result = (len as u64).wrapping_mul(P64_1);
    for i in 0..4 {
        result = result.wrapping_add(mul_fold(acc[2 * i] ^ rd64(&sec, 11 + 16 * i), acc[2 * i + 1] ^ rd64(&sec, 11 + 16 * i + 8)));
    }
    avalanche(result)
}

/// HASH-LOCAL: a page's token ids as little-endian u32.
pub fn local_hash(tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64(&bytes, SEED)
}

/// HASH-SEQUENCE: the first page's sequence hash is its local hash; a later
/// page's chains from its parent's.
pub fn chain_hash(parent: Option<u64>, local: u64) -> u64 {
    match parent {
        None => local,
        Some(p) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&p.to_le_bytes());
            bytes[8..].copy_from_slice(&local.to_le_bytes());
            xxh3_64(&bytes, SEED)
        }
    }
}
