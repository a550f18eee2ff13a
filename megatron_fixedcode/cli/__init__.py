"""Command lines: each module parses its flags importing nothing heavy, then imports the work.

``tools/*.py`` are thin wrappers over these modules; the wheel installs them as console scripts.
"""
