# Typed JSON field getters shared by the six codecs (jsonget.pyx), and the one text of each
# body-level failure. Client bodies are read strictly: a field of the wrong type raises
# ir.CodecError worded by the protocol's own Shape (each codec subclasses it to speak like its
# provider). Upstream bodies are read leniently: a wrong type reads as absent, never raises.


cdef enum:
    # JSON types a getter expects (Shape.bad_type's `expected`)
    J_STRING = 1
    J_INTEGER = 2
    J_NUMBER = 3
    J_BOOLEAN = 4
    J_OBJECT = 5
    J_ARRAY = 6
    J_CONTENT = 7       # a message content: a string or an array of parts
    J_STRINGS = 8       # a string or an array of strings (stop sequences)
    J_CHOICE = 9        # a string or an object (tool_choice)


cdef class Shape:
    """A protocol's wording of a client body's shape errors. The base words are the short form
    `Invalid type for '<path>': expected <a type>.` (Cohere's: its stop_sequences take no single
    string, so J_STRINGS reads "an array of strings"); codecs subclass it to speak like their
    provider."""
    cpdef object bad_type(self, str path, int expected, object value)   # returns a CodecError
    cpdef object missing(self, str path)                                # returns a CodecError


cdef class OpenAIShape(Shape):
    """OpenAI's own wording, shared by Chat Completions and Responses (one platform, one
    validator): `Invalid type for 'messages': expected an array, but got a string instead.`"""
    pass


# Client bodies (strict). `path` is what the error names; None/absent is "unset" for opt_*.
cdef str opt_str(dict d, str key, str path, Shape shape)
cdef str req_str(dict d, str key, str path, Shape shape)
cdef object opt_int(dict d, str key, str path, Shape shape)
cdef object opt_number(dict d, str key, str path, Shape shape)
cdef object opt_bool(dict d, str key, str path, Shape shape)
cdef dict opt_dict(dict d, str key, str path, Shape shape)
cdef list opt_list(dict d, str key, str path, Shape shape)
cdef dict req_dict(dict d, str key, str path, Shape shape)
cdef list req_list(dict d, str key, str path, Shape shape)
# A value already in hand (an array item, a field read under another spelling): required, so None
# is "missing" and any other wrong type is "bad type".
cdef str as_str(object v, str path, Shape shape)
cdef dict as_dict(object v, str path, Shape shape)
cdef list as_list(object v, str path, Shape shape)
cdef dict request_object(bytes body, str not_object)    # parse; PARSE_ERROR / not_object


# Upstream bodies and frames (lenient values, strict framing).
cdef dict upstream_object(bytes body)       # parse; CodecError(UPSTREAM_NOT_JSON) if not an object
cdef dict frame_object(bytes data)          # parse; CodecError(UPSTREAM_BAD_FRAME) if not an object
cdef object frame_too_large()               # the CodecError for a frame over the decoder's limit


cdef inline bint is_int(object v):
    """A JSON integer (orjson gives exact ints; a bool is not one)."""
    return type(v) is int


cdef inline bint is_number(object v):
    return type(v) is int or type(v) is float


cdef inline str str_or_none(object v):
    return <str>v if type(v) is str else None


cdef inline long long count(object v):
    """A token count from an upstream body: a negative, absent or malformed count is 0."""
    if type(v) is int:
        return <long long>v if 0 < v < 9223372036854775807 else 0
    if type(v) is float and 0 < v < 9.2e18:
        return <long long>v
    return 0
