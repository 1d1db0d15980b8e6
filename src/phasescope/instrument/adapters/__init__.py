"""Optional framework adapters. Each module imports its framework at import time and raises a clear
ImportError when that framework is absent, so `import phasescope` never needs them."""
