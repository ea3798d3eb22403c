"""The client-protocol family: emitters (``emit_*``: OpenAI Chat chunks, Anthropic Messages events,
OpenAI Responses events) and request translators (``translate_*``) between a client's protocol and
chat.completions, with the pieces they share (content blocks, tool history, Responses tools)."""
