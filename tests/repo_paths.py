"""Where the repository and this folder are, for test modules at any depth under tests/ and the
helper scripts they start: one definition, not a chain of dirname() calls in every file."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
