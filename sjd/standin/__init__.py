"""Stand-in models: tiny real architectures trained on procedural code images (docs/real-models.md)."""
