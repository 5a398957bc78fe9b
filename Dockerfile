# plnt: one image for every role.
#   plnt reconcile | plnt worker | plnt gateway     the roles of charts/plnt
#   python -m plnt.runner                            runner pods (charts/workflow-runner)
#   plnt recipe fetch                                runner pods' init container
#   plnt model fetch                                 model-server pods' init container (charts/model-server)
#   plnt up                                          everything in one process (the embedded default)
#   temporal server start-dev                        a throwaway Temporal (tools/e2e_kind.sh)
#
#   docker build -t plnt .
#   docker run --rm -p 8000:8000 -v "$PWD/specs:/specs" plnt up --repo /specs --host 0.0.0.0
#
# Runs as uid 10001 with a read-only root filesystem: everything that writes goes to /tmp
# (HOME, TMPDIR, helm's directories) or /var/lib/plnt (the state directory), both volumes in the
# charts. Nothing here was built on the machines plnt is developed on (no Docker engine there);
# tests/charts/test_dockerfile.py checks what can be checked without building.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# A virtualenv outside the source tree: the final stage copies it whole.
RUN python -m venv /opt/plnt
ENV PATH=/opt/plnt/bin:$PATH
COPY pyproject.toml README.md ./
COPY core ./core
COPY reconciler ./reconciler
COPY gateway ./gateway
COPY runner ./runner
RUN pip install --no-cache-dir --upgrade pip \
 && pip install --no-cache-dir .
# The real helm CLI, from the same place `make install` gets it.
COPY tools/install_helm.sh ./tools/install_helm.sh
RUN PYTHON=/opt/plnt/bin/python bash tools/install_helm.sh /opt/plnt/bin
# The charts the Helm driver installs, where it looks for them: beside the installed package
# (plnt.reconciler.drivers.helm.DEFAULT_CHART = <site-packages>/plnt/charts/workflow-runner for
# WorkflowRuns, DEFAULT_MODEL_CHART = <site-packages>/plnt/charts/model-server for ModelDeployments).
COPY charts/workflow-runner ./charts/workflow-runner
COPY charts/model-server ./charts/model-server
RUN site="$(python -c 'import pathlib, plnt.reconciler as r; print(pathlib.Path(r.__file__).resolve().parent.parent)')" \
 && mkdir -p "$site/charts" \
 && cp -r charts/workflow-runner "$site/charts/workflow-runner" \
 && cp -r charts/model-server "$site/charts/model-server" \
 && python -c 'import os, plnt.reconciler.drivers.helm as h; assert all(os.path.isfile(os.path.join(c, "Chart.yaml")) for c in (h.DEFAULT_CHART, h.DEFAULT_MODEL_CHART)), (h.DEFAULT_CHART, h.DEFAULT_MODEL_CHART)'

FROM ${PYTHON_IMAGE}
# git for the spec repository (GitPython runs it), ssh for git@ URLs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client gnupg ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 plnt \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin plnt \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/plnt
COPY --from=build /opt/plnt /opt/plnt
ENV PATH=/opt/plnt/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    HELM_CACHE_HOME=/tmp/helm/cache \
    HELM_CONFIG_HOME=/tmp/helm/config \
    HELM_DATA_HOME=/tmp/helm/data \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
USER 10001:10001
EXPOSE 8000 8080 8081
ENTRYPOINT ["plnt"]
CMD ["--help"]
