"""KV cache events in and out: SGLang's / vLLM's ZMQ + msgpack stream of BlockStored /
BlockRemoved / AllBlocksCleared, published from our radix cache and rebuilt into a block tree."""
