"""Print pyproject.toml's dependencies plus those of the extras named as arguments, one a line.

The Dockerfiles install these in a layer of their own before copying the sources, so that a
code change rebuilds only the small layer on top (`pip install --no-deps .`).
"""

import sys
import tomllib

with open("pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)["project"]
requirements = list(project["dependencies"])
for extra in sys.argv[1:]:
    requirements += project["optional-dependencies"][extra]
print("\n".join(requirements))
