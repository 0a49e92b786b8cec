"""Root pytest configuration: without torch (an optional extra), skip the
doctests of the modules whose examples need it."""

import importlib.util

collect_ignore_glob = []
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob += ["celeritas_cli/run/*.py", "celeritas_cli/profile/optim.py", "celeritas_cli/profile/gpt.py"]
