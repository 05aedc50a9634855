"""Container images for CI and the container-mode control plane (TEST/BUILD INFRASTRUCTURE).

`python -m hack.images build` (`make images`) builds the base images from Debian's archive
(base.py) and every image in deploy/images with its own Dockerfile (deploy.py), each cached by
the hash of what its build reads.
"""
