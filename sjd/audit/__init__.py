"""Exactness audits: are a decoder's samples distributed as AR's?"""
