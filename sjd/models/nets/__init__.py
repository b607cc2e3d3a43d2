"""Network code we own (no hub code): LlamaGen's GPT and VQ, the Chameleon VQGAN decoder."""
