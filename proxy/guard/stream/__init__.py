"""The stream family: SSE framing, chunk accumulation per choice and slot, argument assembly, byte
integrity, markup leaked into text, and upstream errors in the stream (bytes in, a turn and findings out)."""
