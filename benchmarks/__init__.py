"""Benchmarks: perf/ (`make bench`, `python -m benchmarks`) and reliability/ (`make reliability`), one module per
section behind one interface (section.py); scenarios/ holds what they run and the tests reuse; readme.py writes the
README's generated sections. Nothing here imports tests/.
"""
