"""Training pipelines above the layers they compose: models, AR decoding, caption spaces and prompt files."""
