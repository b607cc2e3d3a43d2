"""Everything noise-aware (SJD2): the noisy input path, the adapters that use it, the fine-tune objective and data."""
