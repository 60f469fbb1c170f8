/* Byte runs inside JSON strings, shared by jsonspan.pyx and framing.pyx: 16 bytes a step with SSE2
   (every x86-64), else 8 bytes a step (SWAR), else one. Each returns the length of the run of bytes
   from p[i] that need no attention (n - i when the rest all pass). */
#ifndef BUSBAR_SIMD_H
#define BUSBAR_SIMD_H
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Stops at a quote, a backslash, a control character (< 0x20) or any byte >= 0x80 (the strict
   reader validates UTF-8 itself). */
static inline Py_ssize_t busbar_plain_run(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t start = i;
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8(0x22), b = _mm_set1_epi8(0x5C), sp = _mm_set1_epi8(0x20);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        /* signed < 0x20: the control characters, and every byte >= 0x80 */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, b)),
                                   _mm_cmplt_epi8(v, sp));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return i + __builtin_ctz((unsigned)mask) - start;
        i += 16;
    }
#endif
    while (i + 8 <= n) {
        uint64_t x, t;
        memcpy(&x, p + i, 8);
        t = ((((x ^ 0x2222222222222222ULL) - 0x0101010101010101ULL) & ~(x ^ 0x2222222222222222ULL))
             | (((x ^ 0x5C5C5C5C5C5C5C5CULL) - 0x0101010101010101ULL) & ~(x ^ 0x5C5C5C5C5C5C5C5CULL))
             | ((x - 0x2020202020202020ULL) & ~x) | x) & 0x8080808080808080ULL;
        if (t) return i + (__builtin_ctzll(t) >> 3) - start;
        i += 8;
    }
    while (i < n) {
        unsigned char c = p[i];
        if (c == 0x22 || c == 0x5C || c < 0x20 || c >= 0x80) break;
        i++;
    }
    return i - start;
}

/* Stops at a quote, a backslash or a control character; bytes >= 0x80 pass (the lax scanner of
   framing.pyx does not validate UTF-8: the codecs' parse does). */
static inline Py_ssize_t busbar_str_run(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t start = i;
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8(0x22), b = _mm_set1_epi8(0x5C), c1f = _mm_set1_epi8(0x1F);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        /* unsigned <= 0x1F: max(v, 0x1F) == 0x1F */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, b)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return i + __builtin_ctz((unsigned)mask) - start;
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
#endif
