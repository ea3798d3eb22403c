"""What faces the client: the server launcher and its backpressure (``server``), the routes
(``routing``), the one thin Channels consumer (``consumers``), the client protocols it is parameterized
by (``protocols``: OpenAI Chat, Anthropic Messages, OpenAI Responses), ``ClientResponse`` (the only
writer to the client, ``response``), health and readiness (``health``), and the 404 (``not_found``)."""
