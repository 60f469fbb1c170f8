# Random ids for the codecs without a system call each (ids.pyx).

cpdef str b62(int n)
cpdef str hex_id(int nbytes)
cpdef str uuid4()
cpdef str urlsafe(int nbytes)
cpdef str request_id()
