# The embeddings IR and the four embedding wire protocols (OpenAI /v1/embeddings, Gemini
# :embedContent / :batchEmbedContents, Cohere /v2/embed, Bedrock InvokeModel with a Titan or a
# Cohere-on-Bedrock body). Sans-IO like the chat codecs: bytes in, bytes out (cbusbar/embed.pyx).
#
# Conventions:
# - inputs are texts only (token-id arrays and images are refused with a caller-safe message).
# - input_type is canonical: "query", "document", "classification", "clustering", "similarity",
#   or None (the caller did not say).
# - vectors are lists of Python floats; base64 on the wire is little-endian float32, as OpenAI
#   and Cohere encode it.
# - input_tokens is -1 when the upstream does not report usage (Gemini).

cdef class EmbedRequest:
    cdef public str model
    cdef public list inputs         # list[str]
    cdef public object dimensions   # int or None
    cdef public str input_type      # canonical, or None
    cdef public str encoding        # OpenAI encoding_format: "float" (default) or "base64"
    cdef public list types          # Cohere embedding_types asked for ("float", "base64"), or None
    # which body shape arrived: "titan" or "cohere" (Bedrock), the action
    # "embedContent"/"batchEmbedContents" (Gemini), else None
    cdef public str dialect


cdef class EmbedResponse:
    cdef public list vectors        # list[list[float]], one per input, in order
    cdef public long long input_tokens
    cdef public str model
