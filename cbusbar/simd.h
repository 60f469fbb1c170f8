/* Byte work inside JSON strings, shared by jsonspan.pyx and framing.pyx. The runs go 16 bytes a step
   with SSE2 (every x86-64), else one byte a step, and return the length of the run of bytes from
   p[i] that need no attention (n - i when the rest all pass); the UTF-8 check goes 16 bytes a step
   with SSSE3, else one sequence a step. BUSBAR_NO_SIMD builds the portable forms only. The
   compiler-specific spellings (bit scans, the SSSE3 target and CPU check) are port.h's, so MSVC on
   x86-64 takes the same vector paths. */
#ifndef BUSBAR_SIMD_H
#define BUSBAR_SIMD_H
#include <stdint.h>
#include <string.h>
#include "port.h"
#if defined(BB_SSE2)
#include <emmintrin.h>
#endif

/* Stops at a quote, a backslash or a control character; bytes >= 0x80 pass (the lax scanner of
   framing.pyx does not validate UTF-8: the codecs' parse does). */
static inline Py_ssize_t busbar_str_run(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t start = i;
#if defined(BB_SSE2)
    const __m128i q = _mm_set1_epi8(0x22), b = _mm_set1_epi8(0x5C), c1f = _mm_set1_epi8(0x1F);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        /* unsigned <= 0x1F: max(v, 0x1F) == 0x1F */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, b)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return i + bb_ctz((unsigned)mask) - start;
        i += 16;
    }
#endif
    while (i < n) {
        unsigned char c = p[i];
        if (c == 0x22 || c == 0x5C || c < 0x20) break;
        i++;
    }
    return i - start;
}

/* Like busbar_str_run, and sets *hi when a byte >= 0x80 was passed (the caller then validates the
   run's UTF-8 as a whole: busbar_utf8_valid). */
static inline Py_ssize_t busbar_str_run_hi(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, int *hi) {
    Py_ssize_t start = i;
#if defined(BB_SSE2)
    const __m128i q = _mm_set1_epi8(0x22), b = _mm_set1_epi8(0x5C), c1f = _mm_set1_epi8(0x1F);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, b)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f));
        unsigned mask = (unsigned)_mm_movemask_epi8(hit);
        unsigned high = (unsigned)_mm_movemask_epi8(v);
        if (mask) {
            unsigned tz = (unsigned)bb_ctz(mask);
            if (high & ((1u << tz) - 1u)) *hi = 1;
            return i + tz - start;
        }
        if (high) *hi = 1;
        i += 16;
    }
#endif
    while (i < n) {
        unsigned char c = p[i];
        if (c == 0x22 || c == 0x5C || c < 0x20) break;
        if (c >= 0x80) *hi = 1;
        i++;
    }
    return i - start;
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF, no truncated sequence),
   one byte sequence at a time. */
static inline int busbar_utf8_valid_scalar(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 2 > n || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            unsigned char c1;
            if (i + 3 > n) return 0;
            c1 = p[i + 1];
            if ((c1 & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            unsigned char c1;
            if (i + 4 > n) return 0;
            c1 = p[i + 1];
            if ((c1 & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 || (p[i + 3] & 0xC0) != 0x80) return 0;
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

#if defined(BB_SSSE3_DISPATCH)
#include <tmmintrin.h>
/* The same check 16 bytes a step, branch-free: the lookup algorithm of Keiser and Lemire,
   "Validating UTF-8 In Less Than One Instruction Per Byte" (2021), as simdjson writes it. */
#define BB_TOO_SHORT 1
#define BB_TOO_LONG 2
#define BB_OVERLONG_3 4
#define BB_TOO_LARGE 8
#define BB_SURROGATE 16
#define BB_OVERLONG_2 32
#define BB_TOO_LARGE_1000 64
#define BB_OVERLONG_4 64
#define BB_TWO_CONTS 128
#define BB_CARRY (BB_TOO_SHORT | BB_TOO_LONG | BB_TWO_CONTS)
BB_TARGET_SSSE3
static int busbar_utf8_valid_ssse3(const unsigned char *p, Py_ssize_t n) {
    const __m128i byte_1_high = _mm_setr_epi8(
        BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG, BB_TOO_LONG,
        (char)BB_TWO_CONTS, (char)BB_TWO_CONTS, (char)BB_TWO_CONTS, (char)BB_TWO_CONTS,
        BB_TOO_SHORT | BB_OVERLONG_2,
        BB_TOO_SHORT,
        BB_TOO_SHORT | BB_OVERLONG_3 | BB_SURROGATE,
        BB_TOO_SHORT | BB_TOO_LARGE | BB_TOO_LARGE_1000 | BB_OVERLONG_4);
    const __m128i byte_1_low = _mm_setr_epi8(
        (char)(BB_CARRY | BB_OVERLONG_3 | BB_OVERLONG_2 | BB_OVERLONG_4),
        (char)(BB_CARRY | BB_OVERLONG_2),
        (char)BB_CARRY,
        (char)BB_CARRY,
        (char)(BB_CARRY | BB_TOO_LARGE),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000 | BB_SURROGATE),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000),
        (char)(BB_CARRY | BB_TOO_LARGE | BB_TOO_LARGE_1000));
    const __m128i byte_2_high = _mm_setr_epi8(
        BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT,
        (char)(BB_TOO_LONG | BB_OVERLONG_2 | BB_TWO_CONTS | BB_OVERLONG_3 | BB_TOO_LARGE_1000 | BB_OVERLONG_4),
        (char)(BB_TOO_LONG | BB_OVERLONG_2 | BB_TWO_CONTS | BB_OVERLONG_3 | BB_TOO_LARGE),
        (char)(BB_TOO_LONG | BB_OVERLONG_2 | BB_TWO_CONTS | BB_SURROGATE | BB_TOO_LARGE),
        (char)(BB_TOO_LONG | BB_OVERLONG_2 | BB_TWO_CONTS | BB_SURROGATE | BB_TOO_LARGE),
        BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT, BB_TOO_SHORT);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i third = _mm_set1_epi8((char)(0xE0 - 0x80)), fourth = _mm_set1_epi8((char)(0xF0 - 0x80));
    const __m128i high_bit = _mm_set1_epi8((char)0x80);
    /* a block whose last bytes open a sequence the next block must finish */
    const __m128i max_value = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            (char)(0xF0 - 1), (char)(0xE0 - 1), (char)(0xC0 - 1));
    __m128i prev = _mm_setzero_si128(), err = _mm_setzero_si128(), incomplete = _mm_setzero_si128();
    unsigned char tail[16];
    Py_ssize_t i = 0;
    for (;;) {
        __m128i in, prev1, prev2, prev3, sc, must23;
        if (i + 16 <= n) {
            in = _mm_loadu_si128((const __m128i *)(p + i));
        } else if (i < n) {
            memset(tail, 0, 16);            /* zero padding: a sequence cut short meets ASCII */
            memcpy(tail, p + i, (size_t)(n - i));
            in = _mm_loadu_si128((const __m128i *)tail);
        } else {
            in = _mm_setzero_si128();       /* checks the last block's tail */
        }
        if (!_mm_movemask_epi8(in)) {
            /* all ASCII: only a sequence the previous block left open can be wrong */
            err = _mm_or_si128(err, incomplete);
            incomplete = _mm_setzero_si128();
            if (i >= n) break;
            prev = in;
            i += 16;
            continue;
        }
        prev1 = _mm_alignr_epi8(in, prev, 15);
        sc = _mm_and_si128(
            _mm_and_si128(_mm_shuffle_epi8(byte_1_high, _mm_and_si128(_mm_srli_epi16(prev1, 4), low4)),
                          _mm_shuffle_epi8(byte_1_low, _mm_and_si128(prev1, low4))),
            _mm_shuffle_epi8(byte_2_high, _mm_and_si128(_mm_srli_epi16(in, 4), low4)));
        prev2 = _mm_alignr_epi8(in, prev, 14);
        prev3 = _mm_alignr_epi8(in, prev, 13);
        must23 = _mm_and_si128(_mm_or_si128(_mm_subs_epu8(prev2, third), _mm_subs_epu8(prev3, fourth)),
                               high_bit);
        err = _mm_or_si128(err, _mm_xor_si128(must23, sc));
        incomplete = _mm_subs_epu8(in, max_value);
        if (i >= n) break;
        prev = in;
        i += 16;
    }
    return _mm_movemask_epi8(_mm_cmpeq_epi8(err, _mm_setzero_si128())) == 0xFFFF;
}
#endif

/* Strict UTF-8: the SSSE3 check where the CPU has it (every x86-64 of the last 15 years), else the
   scalar one. */
static inline int busbar_utf8_valid(const unsigned char *p, Py_ssize_t n) {
#if defined(BB_SSSE3_DISPATCH)
    static int ssse3 = -1;
    if (ssse3 < 0) ssse3 = bb_cpu_has_ssse3() ? 1 : 0;
    if (ssse3) return busbar_utf8_valid_ssse3(p, n);
#endif
    return busbar_utf8_valid_scalar(p, n);
}
#endif
