# cbusbar/h1.pyx's entry points, cimported by the server, the pool and the exchange so each request's
# calls into them are C calls (no argument tuple, no wrapper's argument parsing).

cpdef tuple parse_request(bytes data, Py_ssize_t start, Py_ssize_t header_max_bytes,
                          Py_ssize_t header_count_max, Py_ssize_t body_max)
cpdef tuple parse_response(bytes data)
cpdef bytes server_timing(long long ns)
cpdef bytes response_head(bytes status_line, bytes ctype, Py_ssize_t length, bytes extra,
                          bytes timing, bint close)
