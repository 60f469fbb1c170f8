# The request path's clock, read in C (clock.pyx).

cpdef long long now_ns() noexcept
cpdef double monotonic() noexcept
