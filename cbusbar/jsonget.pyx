# cython: language_level=3
"""Typed JSON getters and the body-level failure texts every codec shares (declared in
jsonget.pxd). One wording per failure: the parse error a client sees, and the three ways an
upstream body or stream frame can be unusable."""

import orjson

from cbusbar.ir import CodecError

# The caller-safe texts, once. PARSE_ERROR is OpenAI's own wording (SPEC 1.1), used by all six so a
# client of any protocol reads the same sentence for a body that is not JSON.
PARSE_ERROR = "We could not parse the JSON body of your request."
NOT_AN_OBJECT = "The request body must be a JSON object."
UPSTREAM_NOT_JSON = "The upstream returned a body that is not a JSON object."
UPSTREAM_BAD_FRAME = "The upstream sent a stream frame busbar could not read."
UPSTREAM_FRAME_TOO_LARGE = "The upstream sent a stream frame larger than busbar accepts."

cdef tuple _WORDS = (None, "a string", "an integer", "a number", "a boolean", "an object", "an array",
                     "a string or an array of content parts", "an array of strings",
                     "a string or an object")

# OpenAI's names of the expected type (its validator says "a decimal" for a number) and of the type
# it got instead.
cdef tuple _OPENAI_WORDS = (None, "a string", "an integer", "a decimal", "a boolean", "an object",
                            "an array", "one of a string or array of objects",
                            "one of a string or array of strings", "one of a string or object")


cdef str _openai_kind(object v):
    if v is None:
        return "null"
    if v is True or v is False:
        return "a boolean"
    if type(v) is str:
        return "a string"
    if type(v) is int:
        return "an integer"
    if type(v) is float:
        return "a decimal"
    if type(v) is list:
        return "an array"
    if type(v) is dict:
        return "an object"
    return "a value"


cdef class Shape:

    cpdef object bad_type(self, str path, int expected, object value):
        return CodecError("Invalid type for '%s': expected %s." % (path, _WORDS[expected]))

    cpdef object missing(self, str path):
        return CodecError("Missing required parameter: '%s'." % path)


cdef class OpenAIShape(Shape):

    cpdef object bad_type(self, str path, int expected, object value):
        return CodecError("Invalid type for '%s': expected %s, but got %s instead."
                          % (path, _OPENAI_WORDS[expected], _openai_kind(value)))


cdef str opt_str(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or type(v) is str:
        return v
    raise shape.bad_type(path, J_STRING, v)


cdef str req_str(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if type(v) is str:
        return v
    if v is None:
        raise shape.missing(path)
    raise shape.bad_type(path, J_STRING, v)


cdef object opt_int(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or type(v) is int:
        return v
    raise shape.bad_type(path, J_INTEGER, v)


cdef object opt_number(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or type(v) is int or type(v) is float:
        return v
    raise shape.bad_type(path, J_NUMBER, v)


cdef object opt_bool(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or v is True or v is False:
        return v
    raise shape.bad_type(path, J_BOOLEAN, v)


cdef dict opt_dict(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or type(v) is dict:
        return v
    raise shape.bad_type(path, J_OBJECT, v)


cdef list opt_list(dict d, str key, str path, Shape shape):
    cdef object v = d.get(key)
    if v is None or type(v) is list:
        return v
    raise shape.bad_type(path, J_ARRAY, v)


cdef dict req_dict(dict d, str key, str path, Shape shape):
    return as_dict(d.get(key), path, shape)


cdef list req_list(dict d, str key, str path, Shape shape):
    return as_list(d.get(key), path, shape)


cdef str as_str(object v, str path, Shape shape):
    if type(v) is str:
        return <str>v
    if v is None:
        raise shape.missing(path)
    raise shape.bad_type(path, J_STRING, v)


cdef dict as_dict(object v, str path, Shape shape):
    if type(v) is dict:
        return <dict>v
    if v is None:
        raise shape.missing(path)
    raise shape.bad_type(path, J_OBJECT, v)


cdef list as_list(object v, str path, Shape shape):
    if type(v) is list:
        return <list>v
    if v is None:
        raise shape.missing(path)
    raise shape.bad_type(path, J_ARRAY, v)


cdef dict request_object(bytes body, str not_object):
    cdef object obj
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(PARSE_ERROR) from None
    if type(obj) is not dict:
        raise CodecError(not_object)
    return <dict>obj


cdef dict upstream_object(bytes body):
    cdef object obj
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(UPSTREAM_NOT_JSON) from None
    if type(obj) is not dict:
        raise CodecError(UPSTREAM_NOT_JSON)
    return <dict>obj


cdef dict frame_object(bytes data):
    cdef object obj
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise CodecError(UPSTREAM_BAD_FRAME) from None
    if type(obj) is not dict:
        raise CodecError(UPSTREAM_BAD_FRAME)
    return <dict>obj


cdef object frame_too_large():
    return CodecError(UPSTREAM_FRAME_TOO_LARGE)
