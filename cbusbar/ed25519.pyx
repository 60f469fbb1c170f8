# cython: language_level=3
"""ed25519 signatures (RFC 8032) for virtual-key tokens, through the OpenSSL libcrypto that the
interpreter itself loads for hashlib and ssl.

Why not the `cryptography` package: it carries its own 14 MB OpenSSL, which the single-file
executable leaves out (packaging/busbar.spec); libcrypto is already in every build, because
`_hashlib` and `_ssl` link it. So this module finds the libcrypto the process has loaded (after
`import _hashlib`, in /proc/self/maps; on Windows by its DLL's name among the loaded modules),
takes the eleven functions below from it with dlsym (GetProcAddress: cbusbar/port.h), and
calls them: sign and verify run in OpenSSL's C at the same speed `cryptography` would give.
`cryptography` stays the oracle of the tests (tests/cbusbar/test_ed25519.py).

`AVAILABLE` is False (and `WHY` says why) when no libcrypto with ed25519 (OpenSSL >= 1.1.1) could
be found; busbar/governance/model.py then falls back to `cryptography`.
"""
from libc.stddef cimport size_t

import sys

# dlopen/dlsym, or on Windows GetModuleHandleA/LoadLibraryA and GetProcAddress (port.h)
cdef extern from "port.h" nogil:
    void* bb_dlopen(const char* filename, int flags)
    void* bb_dlsym(void* handle, const char* symbol)
    int BB_RTLD_NOW

# OpenSSL's NID for ed25519 (obj_mac.h: NID_ED25519), stable since 1.1.1.
cdef int NID_ED25519 = 1087
cdef enum:
    SEED_LEN = 32
    PUBLIC_LEN = 32
    SIG_LEN = 64

ctypedef void* (*f_new_raw)(int, void*, const unsigned char*, size_t) noexcept nogil
ctypedef int (*f_get_raw)(const void*, unsigned char*, size_t*) noexcept nogil
ctypedef void (*f_free)(void*) noexcept nogil
ctypedef void* (*f_ctx_new)() noexcept nogil
ctypedef int (*f_init)(void*, void**, const void*, void*, void*) noexcept nogil
ctypedef int (*f_sign)(void*, unsigned char*, size_t*, const unsigned char*, size_t) noexcept nogil
ctypedef int (*f_verify)(void*, const unsigned char*, size_t, const unsigned char*,
                         size_t) noexcept nogil
ctypedef void (*f_void)() noexcept nogil

cdef f_new_raw new_private = NULL
cdef f_new_raw new_public = NULL
cdef f_get_raw get_public = NULL
cdef f_free pkey_free = NULL
cdef f_ctx_new ctx_new = NULL
cdef f_free ctx_free = NULL
cdef f_init sign_init = NULL
cdef f_sign sign_fn = NULL
cdef f_init verify_init = NULL
cdef f_verify verify_fn = NULL
cdef f_void clear_errors = NULL

AVAILABLE = False
WHY = ""


# The names libcrypto goes by where /proc/self/maps cannot say which one is loaded: Windows (the
# python.org build's DLLs\libcrypto-3.dll, -x64 in conda's and OpenSSL's own builds; 1.1.1 before
# Python 3.11) and macOS (Homebrew's and python.org's dylibs).
WINDOWS_NAMES = [b"libcrypto-3-x64.dll", b"libcrypto-3.dll", b"libcrypto-1_1-x64.dll",
                 b"libcrypto-1_1.dll"]
MACOS_NAMES = [b"libcrypto.3.dylib", b"libcrypto.1.1.dylib"]
LINUX_NAMES = [b"libcrypto.so.3", b"libcrypto.so.1.1"]


def _loaded_libcrypto():
    """Paths (or on Windows, module names) of the libcrypto shared objects loaded in this process,
    most likely first."""
    import importlib
    hashlib_ext = None
    try:    # loads libcrypto, when Python links it dynamically
        hashlib_ext = importlib.import_module("_hashlib")
    except ImportError:
        pass
    if sys.platform == "win32":
        # a name bb_dlopen finds among the loaded modules (GetModuleHandleA) before it loads
        # anything; then the same names beside _hashlib.pyd (python.org's DLLs folder)
        import os
        seen = list(WINDOWS_NAMES)
        where = os.path.dirname(getattr(hashlib_ext, "__file__", None) or "")
        if where:
            seen += [os.fsencode(os.path.join(where, os.fsdecode(n))) for n in WINDOWS_NAMES]
        return seen
    seen = []
    try:
        with open("/proc/self/maps", "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    # (the build compiles without wraparound: no negative indices here)
                    path = parts[len(parts) - 1]
                    name = path.rpartition(b"/")[2]
                    if name.startswith(b"libcrypto.so") and path not in seen:
                        seen.append(path)
    except OSError:
        pass
    return seen


def _candidates():
    """Where _load looks, in order: what this process loaded, then the usual names."""
    if sys.platform == "win32":
        return _loaded_libcrypto()
    return _loaded_libcrypto() + (MACOS_NAMES if sys.platform == "darwin" else LINUX_NAMES)


def _looked_in():
    """The places _load looked, for WHY."""
    if sys.platform == "win32":
        return "among the loaded modules and beside _hashlib for " + ", ".join(
            n.decode() for n in WINDOWS_NAMES)
    names = MACOS_NAMES if sys.platform == "darwin" else LINUX_NAMES
    return "in /proc/self/maps and for " + ", ".join(n.decode() for n in names)


cdef void* _sym(void* h, const char* name):
    return bb_dlsym(h, name)


cdef int _bind(void* h):
    global new_private, new_public, get_public, pkey_free, ctx_new, ctx_free
    global sign_init, sign_fn, verify_init, verify_fn, clear_errors
    new_private = <f_new_raw>_sym(h, b"EVP_PKEY_new_raw_private_key")
    new_public = <f_new_raw>_sym(h, b"EVP_PKEY_new_raw_public_key")
    get_public = <f_get_raw>_sym(h, b"EVP_PKEY_get_raw_public_key")
    pkey_free = <f_free>_sym(h, b"EVP_PKEY_free")
    ctx_new = <f_ctx_new>_sym(h, b"EVP_MD_CTX_new")
    ctx_free = <f_free>_sym(h, b"EVP_MD_CTX_free")
    sign_init = <f_init>_sym(h, b"EVP_DigestSignInit")
    sign_fn = <f_sign>_sym(h, b"EVP_DigestSign")
    verify_init = <f_init>_sym(h, b"EVP_DigestVerifyInit")
    verify_fn = <f_verify>_sym(h, b"EVP_DigestVerify")
    clear_errors = <f_void>_sym(h, b"ERR_clear_error")
    return (new_private != NULL and new_public != NULL and get_public != NULL and
            pkey_free != NULL and ctx_new != NULL and ctx_free != NULL and sign_init != NULL and
            sign_fn != NULL and verify_init != NULL and verify_fn != NULL and clear_errors != NULL)


def _load():
    global AVAILABLE, WHY
    cdef void* h
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
    WHY = ("no OpenSSL libcrypto with ed25519 (1.1.1 or later) is loaded in this process "
           "(looked %s)" % _looked_in())


_load()


cdef class Ed25519Key:
    """An ed25519 key from its 32-byte seed: signs, and verifies with its public half. The OpenSSL
    keys live as long as the object."""
    cdef void* private
    cdef void* public
    cdef readonly bytes public_bytes

    def __cinit__(self, bytes seed):
        cdef unsigned char pub[PUBLIC_LEN]
        cdef size_t n = PUBLIC_LEN
        if not AVAILABLE:
            raise RuntimeError(WHY)
        if len(seed) != SEED_LEN:
            raise ValueError("an ed25519 seed is 32 bytes")
        self.private = new_private(NID_ED25519, NULL, <const unsigned char*>seed, SEED_LEN)
        if self.private == NULL:
            clear_errors()
            raise RuntimeError("OpenSSL refused the ed25519 seed")
        if get_public(self.private, pub, &n) != 1 or n != PUBLIC_LEN:
            raise RuntimeError("OpenSSL could not derive the ed25519 public key")
        self.public_bytes = pub[:PUBLIC_LEN]
        self.public = new_public(NID_ED25519, NULL, pub, PUBLIC_LEN)
        if self.public == NULL:
            raise RuntimeError("OpenSSL refused the ed25519 public key")

    def __dealloc__(self):
        if self.private != NULL:
            pkey_free(self.private)
        if self.public != NULL:
            pkey_free(self.public)

    def sign(self, bytes message):
        """The 64-byte signature of `message` (deterministic, RFC 8032)."""
        cdef unsigned char sig[SIG_LEN]
        cdef size_t n = SIG_LEN
        cdef void* ctx = ctx_new()
        cdef int ok
        if ctx == NULL:
            raise MemoryError()
        ok = (sign_init(ctx, NULL, NULL, NULL, self.private) == 1 and
              sign_fn(ctx, sig, &n, <const unsigned char*>message, len(message)) == 1)
        ctx_free(ctx)
        if not ok or n != SIG_LEN:
            clear_errors()
            raise RuntimeError("OpenSSL could not sign")
        return sig[:SIG_LEN]

    def verify(self, bytes signature, bytes message):
        """True when `signature` is this key's over `message`."""
        return _verify(self.public, signature, message)


cdef bint _verify(void* public, bytes signature, bytes message) except -1:
    cdef void* ctx
    cdef bint ok
    if len(signature) != SIG_LEN:
        return False
    ctx = ctx_new()
    if ctx == NULL:
        raise MemoryError()
    ok = (verify_init(ctx, NULL, NULL, NULL, public) == 1 and
          verify_fn(ctx, <const unsigned char*>signature, SIG_LEN,
                    <const unsigned char*>message, len(message)) == 1)
    ctx_free(ctx)
    if not ok:
        # A refused signature may leave entries on this thread's OpenSSL error queue, which the
        # ssl module would otherwise report as the cause of its next, unrelated failure.
        clear_errors()
    return ok


def verify_public(bytes public_key, bytes signature, bytes message):
    """True when `signature` over `message` verifies under the 32-byte `public_key` (a key known
    only by its public half, as the tests' independent signer has it)."""
    cdef void* pub
    if not AVAILABLE:
        raise RuntimeError(WHY)
    if len(public_key) != PUBLIC_LEN:
        return False
    pub = new_public(NID_ED25519, NULL, <const unsigned char*>public_key, PUBLIC_LEN)
    if pub == NULL:
        clear_errors()
        return False
    try:
        return _verify(pub, signature, message)
    finally:
        pkey_free(pub)
