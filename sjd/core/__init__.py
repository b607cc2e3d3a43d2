"""The pure core every decoder shares: sampling, draft initialisation, verification rules."""
