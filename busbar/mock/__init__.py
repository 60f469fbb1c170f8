"""busbar's built-in mock provider: all six LLM wire protocols, deterministic answers, failure switches.

Run it with ``busbar mock --port 8089`` (or ``main()``), or inside a test with
``server, port = await start()``. It stands in for the real providers in the demo, the tests and the
benchmark: it is an independent implementation of each provider's wire format (written from the
official SDKs, never from busbar's own codecs), so a gateway codec bug shows up as a mismatch.

Routes
------
==========================================================  =========================================
``POST /v1/chat/completions``                               OpenAI Chat Completions
``POST /v1/responses``                                      OpenAI Responses
``POST /v1/messages``                                       Anthropic Messages
``POST /v1beta/models/{model}:generateContent``             Gemini (also under ``/v1/``)
``POST /v1beta/models/{model}:streamGenerateContent``       Gemini stream: ``?alt=sse`` gives SSE,
                                                            otherwise one JSON array streamed
                                                            element by element
``POST /v2/chat``                                           Cohere v2 chat
``POST /model/{modelId}/converse``                          Bedrock Converse (modelId percent-decoded)
``POST /model/{modelId}/converse-stream``                   Bedrock ConverseStream (binary AWS
                                                            eventstream)
``GET /healthz``                                            200 ``ok``
==========================================================  =========================================

Any other path: 404 JSON. Another Gemini action (``:countTokens``...) or Bedrock ``/invoke``: 404 in
that protocol's envelope. A protocol path with another method: 405.

Streaming is requested as each protocol does it: ``"stream": true`` in the body (OpenAI, Responses,
Anthropic, Cohere) or the streaming path (Gemini, Bedrock). Streams are sent with chunked transfer
encoding, one protocol frame per chunk:

- OpenAI: ``data:`` chunks (role, one per word, finish), a ``choices: []`` usage chunk when
  ``stream_options.include_usage`` (then every chunk carries ``"usage": null``), ``data: [DONE]``.
- Responses: response.created, response.in_progress, response.output_item.added,
  response.content_part.added, response.output_text.delta..., response.output_text.done,
  response.content_part.done, response.output_item.done, response.completed (response.incomplete
  when cut by max_output_tokens); a tool call sends function_call_arguments.delta/.done instead of
  the content events. Every event has a ``sequence_number``.
- Anthropic: message_start (output_tokens 1), ping, content_block_start, content_block_delta...,
  content_block_stop, message_delta (usage: running totals), message_stop.
- Gemini: one chunk per word with running usageMetadata, finishReason on the last; SSE lines end in
  CRLF as on the real API. Function calls arrive whole in one chunk (the Gemini API does not stream
  arguments).
- Cohere: ``event:``/``data:`` pairs message-start, content-start, content-delta..., content-end
  (or tool-plan-delta..., tool-call-start, tool-call-delta..., tool-call-end), message-end, then
  ``data: [DONE]``.
- Bedrock: eventstream messages messageStart, [contentBlockStart for a tool call],
  contentBlockDelta..., contentBlockStop, messageStop, metadata; each payload carries the real
  service's ``"p"`` padding field.

Responses carry ``content-type`` (``application/json``, ``text/event-stream``,
``application/vnd.amazon.eventstream``), ``request-id: req_...`` for Anthropic,
``x-amzn-RequestId`` for Bedrock (plus ``x-amzn-ErrorType`` on its errors) and ``x-request-id`` for
OpenAI/Responses.

The answer
----------
Text answers are ``mock: <text of the last user message>`` (the last user message that has any
text; its text parts joined; cut to 200 characters), followed by

- `` [system: <first 60 characters of the system prompt>]`` when there is one,
- `` [images: N]`` when the conversation has N image parts,
- `` [tool_result: <first 100 characters of the first result's text>]`` when the last user turn
  (everything after the last assistant turn) carries tool results,
- `` [auth:<scheme>]`` only with the ``echo_auth`` directive: the credential carrier the request used,
  one of ``bearer``, ``x-api-key``, ``x-goog-api-key``, ``key-param`` (Gemini ``?key=``), ``sigv4``,
  ``none``,

then the filler words ``w1 w2 ... wN`` (N = the ``tokens`` directive, default 8). Whitespace runs
collapse to one space; each word is one output token (the echo counts its words too) and one stream
delta. When the request's own max-tokens field (``max_completion_tokens``/``max_tokens``,
``max_output_tokens``, ``max_tokens``, ``generationConfig.maxOutputTokens``, ``max_tokens``,
``inferenceConfig.maxTokens``) is below the word count, the answer is cut to that many words and
the stop reason is the protocol's max-tokens one (length, incomplete/max_output_tokens, max_tokens,
MAX_TOKENS, MAX_TOKENS, max_tokens).

Tool calls: when the request declares tools and either the ``tool`` directive is set or
tool_choice forces a tool (OpenAI ``required``/a named function, Responses ``required``/a function,
Anthropic ``any``/``tool``, Gemini mode ``ANY`` [+ allowedFunctionNames], Cohere ``REQUIRED``,
Bedrock ``any``/``tool``), the answer is one call to the named tool (``tool=<name>`` picks a declared
tool by name), else the forced one, else the first declared. Its arguments hold ``"mock"`` for each
required property of the tool's schema, or ``{"input": "mock"}`` when none is required. Ids are
native (``call_...``, ``toolu_01...``, ``tooluse_...``, Cohere ``<name>_...``; Gemini sends none),
the stop reason is the protocol's tool one (Gemini: STOP, as the real API), and a streamed call sends
its arguments in 8-character fragments (at least two). A call counts 1 output token plus one per
argument.

Usage: input tokens = max(1, len(body) // 4); output tokens as above. Anthropic and Bedrock report
cache fields as 0; OpenAI sends prompt/completion_tokens_details, Responses input/output details,
Gemini usageMetadata, Cohere billed_units and tokens.

Request checks (400 in the native envelope, so a gateway translation bug fails loudly): malformed
JSON or a non-object body; missing ``model`` (body-model protocols); Anthropic without
``max_tokens``; Gemini bodies carrying ``model``/``stream``; Bedrock bodies with any key that is not
a ConverseRequest member. Bodies beyond 64 MiB get 413 and the connection is closed.

Directives
----------
Set per request by a header ``x-mock-<key>: <value>`` or by ``#mock:<key>=<value>`` anywhere in the
raw body (e.g. in the prompt, so it survives a gateway translating the body); values match
``[A-Za-z0-9_.-]+``; headers win over the body.

``status=<400..599>``  answer that status in the native error envelope, message "mock failure <code>"
``delay_ms=<n>``       wait n ms (at most 60000) before the response headers
``abort_after=<n>``    streaming: send n frames, then close the connection without ending the chunked
                       body; a buffered request loses its connection before any response byte
``tokens=<n>``         n filler words (at most 100000)
``tool=1|<name>``      force a tool call (when tools are declared)
``stream_error=1``     streaming: after the first frame, send the protocol's in-band error and end
                       the stream (OpenAI ``data: {"error":...}``, Responses response.failed,
                       Anthropic ``event: error``, Gemini ``{"error":...}`` as SSE data or as the last
                       array element, Cohere message-end with finish_reason ERROR then [DONE],
                       Bedrock a modelStreamErrorException frame)
``echo_auth=1``        append `` [auth:<scheme>]`` to the answer (header form: ``x-mock-echo-auth``)

require_auth
------------
With ``require_auth=True`` (``start()``/``main()`` argument) each protocol's own credential carrier
must be present and non-empty, else the real provider's refusal: OpenAI, Responses, Cohere
``Authorization: Bearer`` (401); Anthropic ``x-api-key`` or Bearer (401) and an
``anthropic-version`` header (400, as the real API); Gemini ``x-goog-api-key`` or ``?key=`` (403
PERMISSION_DENIED); Bedrock ``Authorization: AWS4-HMAC-SHA256 ...`` with ``X-Amz-Date`` (403). Keys
and signatures are not verified.

HTTP
----
HTTP/1.1 with keep-alive and pipelining (answers in request order), ``Expect: 100-continue``;
no framework: an asyncio.Protocol driving httptools, orjson, uvloop (or the standard library's loop:
``BUSBAR_LOOP``, busbar/server/runtime.py) under ``main()``.
"""

from busbar.mock.server import main, start

__all__ = ["start", "main"]
