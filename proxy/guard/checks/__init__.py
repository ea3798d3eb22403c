"""The checks family: the client's request prepared and bounded (``request``, ``schema_bounds``,
``schema_regex``), a turn validated against the declared tools (``validate``) with policy-gated repairs
(``repair``), and the side checks of a byte-exact pass-through stream (``passcheck``)."""
