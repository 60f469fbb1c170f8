# cython: language_level=3
"""RS256 signatures (RSASSA-PKCS1-v1_5 with SHA-256, RFC 7518 §3.3) for Vertex AI's service-account
JWTs, through the OpenSSL libcrypto that the interpreter itself loads for hashlib and ssl.

The same approach as cbusbar/ed25519.pyx, whose loader finds that libcrypto: the functions below
are taken from it with dlsym. This lets the single-file executable leave out the `cryptography`
package, whose extension carries a second OpenSSL of its own (packaging/busbar.spec);
busbar/upstream/gcp_oauth.py falls back to `cryptography` where `AVAILABLE` is False (`WHY` says
why), and the tests check both against `cryptography` and google-auth as verifiers.

A key is read with PEM_read_bio_PrivateKey: PKCS#8 (what Google's key files hold) or PKCS#1,
never an encrypted one (the passphrase callback refuses, so OpenSSL never prompts on a terminal).
"""
from libc.stddef cimport size_t

# dlopen/dlsym, or on Windows GetModuleHandleA/LoadLibraryA and GetProcAddress (port.h)
cdef extern from "port.h" nogil:
    void* bb_dlopen(const char* filename, int flags)
    void* bb_dlsym(void* handle, const char* symbol)
    int BB_RTLD_NOW

# OpenSSL's NID for an RSA key (obj_mac.h: NID_rsaEncryption / EVP_PKEY_RSA), stable since 0.9.
cdef int EVP_PKEY_RSA = 6
# The largest modulus signed here: 16384 bits (OpenSSL's own limit, OPENSSL_RSA_MAX_MODULUS_BITS).
cdef enum:
    MAX_SIG = 2048

ctypedef int (*pem_cb)(char*, int, int, void*) noexcept nogil
ctypedef void* (*f_bio_new_mem)(const void*, int) noexcept nogil
ctypedef int (*f_bio_free)(void*) noexcept nogil
ctypedef void* (*f_read_key)(void*, void**, pem_cb, void*) noexcept nogil
ctypedef int (*f_pkey_int)(const void*) noexcept nogil
ctypedef void (*f_free)(void*) noexcept nogil
ctypedef void* (*f_ctx_new)() noexcept nogil
ctypedef const void* (*f_md)() noexcept nogil
ctypedef int (*f_init)(void*, void**, const void*, void*, void*) noexcept nogil
ctypedef int (*f_sign)(void*, unsigned char*, size_t*, const unsigned char*, size_t) noexcept nogil
ctypedef void (*f_void)() noexcept nogil

cdef f_bio_new_mem bio_new_mem = NULL
cdef f_bio_free bio_free = NULL
cdef f_read_key read_key = NULL
cdef f_pkey_int key_type = NULL
cdef f_pkey_int key_size = NULL
cdef f_free pkey_free = NULL
cdef f_ctx_new ctx_new = NULL
cdef f_free ctx_free = NULL
cdef f_md sha256 = NULL
cdef f_init sign_init = NULL
cdef f_sign sign_fn = NULL
cdef f_void clear_errors = NULL

AVAILABLE = False
WHY = ""


cdef int _no_passphrase(char* buf, int size, int rwflag, void* u) noexcept nogil:
    return -1


cdef void* _sym(void* h, const char* name):
    return bb_dlsym(h, name)


cdef void* _either(void* h, const char* name, const char* older):
    # OpenSSL 3 renamed some getters (EVP_PKEY_get_base_id); 1.1.1 exports the old names.
    cdef void* f = bb_dlsym(h, name)
    return f if f != NULL else bb_dlsym(h, older)


cdef int _bind(void* h):
    global bio_new_mem, bio_free, read_key, key_type, key_size, pkey_free, ctx_new, ctx_free
    global sha256, sign_init, sign_fn, clear_errors
    bio_new_mem = <f_bio_new_mem>_sym(h, b"BIO_new_mem_buf")
    bio_free = <f_bio_free>_sym(h, b"BIO_free")
    read_key = <f_read_key>_sym(h, b"PEM_read_bio_PrivateKey")
    key_type = <f_pkey_int>_either(h, b"EVP_PKEY_get_base_id", b"EVP_PKEY_base_id")
    key_size = <f_pkey_int>_either(h, b"EVP_PKEY_get_size", b"EVP_PKEY_size")
    pkey_free = <f_free>_sym(h, b"EVP_PKEY_free")
    ctx_new = <f_ctx_new>_sym(h, b"EVP_MD_CTX_new")
    ctx_free = <f_free>_sym(h, b"EVP_MD_CTX_free")
    sha256 = <f_md>_sym(h, b"EVP_sha256")
    sign_init = <f_init>_sym(h, b"EVP_DigestSignInit")
    sign_fn = <f_sign>_sym(h, b"EVP_DigestSign")
    clear_errors = <f_void>_sym(h, b"ERR_clear_error")
    return (bio_new_mem != NULL and bio_free != NULL and read_key != NULL and key_type != NULL and
            key_size != NULL and pkey_free != NULL and ctx_new != NULL and ctx_free != NULL and
            sha256 != NULL and sign_init != NULL and sign_fn != NULL and clear_errors != NULL)


def _load():
    global AVAILABLE, WHY
    cdef void* h
    from cbusbar.ed25519 import _candidates, _looked_in
    for path in _candidates():
        h = bb_dlopen(path, BB_RTLD_NOW)
        if h != NULL and _bind(h):
            AVAILABLE = True
            return
    # A Python linked with a static libcrypto: its symbols are the process's own.
    h = bb_dlopen(NULL, BB_RTLD_NOW)
    if h != NULL and _bind(h):
        AVAILABLE = True
        return
    WHY = ("no OpenSSL libcrypto with EVP_DigestSign (1.1.1 or later) is loaded in this process "
           "(looked %s)" % _looked_in())


_load()


cdef class RsaKey:
    """An RSA private key read from PEM: signs RS256. The OpenSSL key lives as long as the object;
    its repr names nothing of it."""
    cdef void* pkey
    cdef readonly int size      # the signature's length in bytes (the modulus')

    def __cinit__(self, pem):
        cdef void* bio
        cdef bytes data
        if not AVAILABLE:
            raise RuntimeError(WHY)
        data = pem.encode() if isinstance(pem, str) else bytes(pem)
        if len(data) == 0 or len(data) > 1 << 20:
            raise ValueError("not a PEM private key")
        bio = bio_new_mem(<const char*>data, len(data))
        if bio == NULL:
            raise MemoryError()
        self.pkey = read_key(bio, NULL, _no_passphrase, NULL)
        bio_free(bio)
        if self.pkey == NULL:
            clear_errors()
            raise ValueError("not a PEM private key")
        if key_type(self.pkey) != EVP_PKEY_RSA:
            raise TypeError("not an RSA key")
        self.size = key_size(self.pkey)
        if self.size <= 0 or self.size > MAX_SIG:
            raise ValueError("an RSA key of an unsupported size")

    def __dealloc__(self):
        if self.pkey != NULL:
            pkey_free(self.pkey)

    def __repr__(self):
        return "RsaKey(%d bits)" % (self.size * 8)

    def sign(self, message):
        """The RS256 signature of `message` (bytes): PKCS#1 v1.5 over its SHA-256."""
        cdef unsigned char sig[MAX_SIG]
        cdef size_t n = MAX_SIG
        cdef bytes data = bytes(message)
        cdef const unsigned char* p = <const unsigned char*>data
        cdef size_t length = len(data)
        cdef void* ctx = ctx_new()
        cdef int ok
        if ctx == NULL:
            raise MemoryError()
        with nogil:
            # RSA's default padding under EVP_DigestSign is PKCS#1 v1.5.
            ok = (sign_init(ctx, NULL, sha256(), NULL, self.pkey) == 1 and
                  sign_fn(ctx, sig, &n, p, length) == 1)
        ctx_free(ctx)
        if not ok or <int>n != self.size:
            clear_errors()
            raise RuntimeError("OpenSSL could not sign")
        return sig[:n]
