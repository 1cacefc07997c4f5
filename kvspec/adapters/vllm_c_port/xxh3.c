/* xxh3.c -- XXH3-64 with a seed (see xxh3.h). Portable C11, no 128-bit types. */
#include "xxh3.h"

#include <string.h>

#define P32_1 0x9E3779B1u
#define P32_2 0x85EBCA77u
#define P32_3 0xC2B2AE3Du
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull
#define PMX_1 0x165667919E3779F9ull
#define PMX_2 0x9FB21C651E98DF25ull

#define SECRET_SIZE 192
#define STRIPE 64

/* The algorithm's default secret (192 bytes). */
static const uint8_t K_SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t swap64(uint64_t x) {
    uint64_t r = 0;
    for (int i = 0; i < 8; i++) r = (r << 8) | ((x >> (8 * i)) & 0xff);
    return r;
}

static uint32_t swap32(uint32_t x) {
    return (x << 24) | ((x << 8) & 0xff0000u) | ((x >> 8) & 0xff00u) | (x >> 24);
}

/* The 128-bit product of two u64, folded: low half xor high half. */
static uint64_t mul_fold(uint64_t a, uint64_t b) {
    uint64_t lo_lo = (a & 0xffffffffu) * (b & 0xffffffffu);
    uint64_t hi_lo = (a >> 32) * (b & 0xffffffffu);
    uint64_t lo_hi = (a & 0xffffffffu) * (b >> 32);
    uint64_t hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xffffffffu);
    return lower ^ upper;
}

static uint64_t avalanche_xxh64(uint64_t h) {
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    h ^= h >> 32;
    return h;
}

static uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= PMX_1;
    h ^= h >> 32;
    return h;
}

static uint64_t rrmxmx(uint64_t h, uint64_t len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= PMX_2;
    h ^= (h >> 35) + len;
    h *= PMX_2;
    return h ^ (h >> 28);
}

static uint64_t mix16(const uint8_t *in, const uint8_t *sec, uint64_t seed) {
    return mul_fold(rd64(in) ^ (rd64(sec) + seed), rd64(in + 8) ^ (rd64(sec + 8) - seed));
}

static uint64_t len_0to16(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *s = K_SECRET;
    if (len > 8) {
        uint64_t lo = rd64(in) ^ ((rd64(s + 24) ^ rd64(s + 32)) + seed);
        uint64_t hi = rd64(in + len - 8) ^ ((rd64(s + 40) ^ rd64(s + 48)) - seed);
        return avalanche(len + swap64(lo) + hi + mul_fold(lo, hi));
    }
    if (len >= 4) {
        seed ^= (uint64_t)swap32((uint32_t)seed) << 32;
        uint64_t in64 = (uint64_t)rd32(in + len - 4) + ((uint64_t)rd32(in) << 32);
        return rrmxmx(in64 ^ ((rd64(s + 8) ^ rd64(s + 16)) - seed), len);
    }
    if (len > 0) {
        uint32_t combined = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) | (uint32_t)in[len - 1] |
                            ((uint32_t)len << 8);
        return avalanche_xxh64((uint64_t)combined ^ ((uint64_t)(rd32(s) ^ rd32(s + 4)) + seed));
    }
    return avalanche_xxh64(seed ^ (rd64(s + 56) ^ rd64(s + 64)));
}

static uint64_t len_17to128(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *s = K_SECRET;
    uint64_t acc = len * P64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, s + 96, seed);
                acc += mix16(in + len - 64, s + 112, seed);
            }
            acc += mix16(in + 32, s + 64, seed);
            acc += mix16(in + len - 48, s + 80, seed);
        }
        acc += mix16(in + 16, s + 32, seed);
        acc += mix16(in + len - 32, s + 48, seed);
    }
    acc += mix16(in, s, seed);
    acc += mix16(in + len - 16, s + 16, seed);
    return avalanche(acc);
}

static uint64_t len_129to240(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *s = K_SECRET;
    uint64_t acc = len * P64_1;
    size_t rounds = len / 16;
    for (size_t i = 0; i < 8; i++) acc += mix16(in + 16 * i, s + 16 * i, seed);
    acc = avalanche(acc);
    for (size_t i = 8; i < rounds; i++) acc += mix16(in + 16 * i, s + 16 * (i - 8) + 3, seed);
    acc += mix16(in + len - 16, s + 136 - 17, seed);
    return avalanche(acc);
}

static void accumulate_stripe(uint64_t acc[8], const uint8_t *in, const uint8_t *sec) {
    for (int i = 0; i < 8; i++) {
        uint64_t v = rd64(in + 8 * i);
        uint64_t k = v ^ rd64(sec + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (k & 0xffffffffu) * (k >> 32);
    }
}

static void scramble(uint64_t acc[8], const uint8_t *sec) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(sec + 8 * i);
        a *= P32_1;
        acc[i] = a;
    }
}

static uint64_t hash_long(const uint8_t *in, size_t len, uint64_t seed) {
    uint8_t sec[SECRET_SIZE];
    for (size_t i = 0; i < SECRET_SIZE; i += 16) {
        wr64(sec + i, rd64(K_SECRET + i) + seed);
        wr64(sec + i + 8, rd64(K_SECRET + i + 8) - seed);
    }
    uint64_t acc[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    const size_t per_block = (SECRET_SIZE - STRIPE) / 8;
    const size_t block_len = STRIPE * per_block;
    const size_t blocks = (len - 1) / block_len;
    for (size_t b = 0; b < blocks; b++) {
        for (size_t n = 0; n < per_block; n++) accumulate_stripe(acc, in + b * block_len + n * STRIPE, sec + n * 8);
        scramble(acc, sec + SECRET_SIZE - STRIPE);
    }
    const size_t stripes = ((len - 1) - block_len * blocks) / STRIPE;
    for (size_t n = 0; n < stripes; n++) accumulate_stripe(acc, in + blocks * block_len + n * STRIPE, sec + n * 8);
    accumulate_stripe(acc, in + len - STRIPE, sec + SECRET_SIZE - STRIPE - 7);
    uint64_t r = (uint64_t)len * P64_1;
    for (int i = 0; i < 4; i++) r += mul_fold(acc[2 * i] ^ rd64(sec + 11 + 16 * i), acc[2 * i + 1] ^ rd64(sec + 11 + 16 * i + 8));
    return avalanche(r);
}

uint64_t xxh3_64(const void *input, size_t len, uint64_t seed) {
    const uint8_t *in = (const uint8_t *)input;
    if (len <= 16) return len_0to16(in, len, seed);
    if (len <= 128) return len_17to128(in, len, seed);
    if (len <= 240) return len_129to240(in, len, seed);
    return hash_long(in, len, seed);
}

uint64_t kv_local_hash(const uint32_t *tokens, size_t n) {
    uint8_t buf[4096 * 4]; /* a block holds at most 4096 tokens (ManagerConfig.block_size) */
    if (n > 4096) n = 4096;
    for (size_t i = 0; i < n; i++) {
        buf[4 * i] = (uint8_t)tokens[i];
        buf[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
        buf[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
        buf[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
    }
    return xxh3_64(buf, n * 4, KV_HASH_SEED);
}

uint64_t kv_sequence_hash(int has_parent, uint64_t parent, uint64_t local) {
    if (!has_parent) return local;
    uint8_t buf[16];
    wr64(buf, parent);
    wr64(buf + 8, local);
    return xxh3_64(buf, sizeof buf, KV_HASH_SEED);
}
