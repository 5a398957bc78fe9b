{{/*
Names. Every object is "<fullname>-<role>" (or "<fullname>-<role>-<purpose>"), so two plnt releases
coexist in one namespace and a role's objects read as a group in `kubectl get`.
*/}}
{{- define "plnt.fullname" -}}
{{- $name := .Values.fullnameOverride | default (ternary .Release.Name (printf "%s-plnt" .Release.Name) (contains "plnt" .Release.Name)) -}}
{{- if gt (len $name) 40 -}}
{{- fail (printf "the name prefix %q is longer than 40 characters: set fullnameOverride (Service names append -reconciler and must stay within 63)" $name) -}}
{{- end -}}
{{- $name | trimSuffix "-" -}}
{{- end -}}

{{- define "plnt.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels of one role's objects: pass (dict "ctx" $ "role" "gateway"). */}}
{{- define "plnt.selectorLabels" -}}
app.kubernetes.io/name: plnt
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "plnt.labels" -}}
{{ include "plnt.selectorLabels" . }}
app.kubernetes.io/part-of: plnt
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of objects that belong to no single role (the internal token, namespace policies). */}}
{{- define "plnt.commonLabels" -}}
app.kubernetes.io/name: plnt
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: plnt
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The reconciler's Service: the control API the workers and gateways call. */}}
{{- define "plnt.controlUrl" -}}
http://{{ include "plnt.fullname" . }}-reconciler.{{ .Release.Namespace }}.svc:{{ .Values.reconciler.port }}
{{- end -}}

{{- define "plnt.leaseName" -}}
{{- .Values.reconciler.lease.name | default (printf "%s-reconciler" (include "plnt.fullname" .)) -}}
{{- end -}}

{{- define "plnt.internalTokenSecret" -}}
{{- .Values.auth.internalToken.secretName | default (printf "%s-internal-token" (include "plnt.fullname" .)) -}}
{{- end -}}

{{/* Values every install must give; checked once, by the templates that use them. */}}
{{- define "plnt.required" -}}
{{- if eq .Values.source.kind "kubernetes" -}}
{{- include "plnt.kubernetesSourceGuards" . -}}
{{- else -}}
{{- $_ := required "git.repo is required: the URL of the spec repository plnt tracks (or source.kind: kubernetes, to read WorkflowRuns from the cluster)" .Values.git.repo -}}
{{- end -}}
{{- $_ := required "temporal.address is required: HOST:PORT of your Temporal frontend" .Values.temporal.address -}}
{{- $_ := required "auth.tokens.secretName is required: plnt refuses to serve on a non-loopback address without caller tokens (a Secret holding a tokens file, docs/gateway.md \"Gateway authentication\")" .Values.auth.tokens.secretName -}}
{{- end -}}

{{/*
Pod and container security: the `restricted` Pod Security Standard (v1.25+), field by field.
The root filesystem is read-only; every writable path is an emptyDir (or the state PVC).
*/}}
{{- define "plnt.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsGroup }}
fsGroup: {{ .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "plnt.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* HOME and helm's directories on the /tmp emptyDir: nothing writes to the read-only root. */}}
{{- define "plnt.env" -}}
- name: HOME
  value: /tmp
- name: TMPDIR
  value: /tmp
- name: HELM_CACHE_HOME
  value: /tmp/helm/cache
- name: HELM_CONFIG_HOME
  value: /tmp/helm/config
- name: HELM_DATA_HOME
  value: /tmp/helm/data
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/*
OpenTelemetry traces (tracing.*), the SDK's own OTEL_* variables, for one role:
(dict "ctx" $ "role" "gateway"). Nothing at all when tracing.endpoint is empty (plnt then sets no
tracer up: no cost). The headers (collector credentials) only from a Secret, never from values.
*/}}
{{- define "plnt.tracingEnv" -}}
{{- $t := .ctx.Values.tracing -}}
{{- if $t.endpoint -}}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $t.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $t.protocol | quote }}
- name: OTEL_SERVICE_NAME
  value: plnt-{{ .role }}
{{- with $t.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $t.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- with $t.headers.secretName }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $t.headers.key }}
{{- end }}
- name: PLNT_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- $attributes := list (printf "k8s.namespace.name=%s" .ctx.Release.Namespace) "k8s.pod.name=$(PLNT_POD_NAME)" (printf "k8s.deployment.name=%s-%s" (include "plnt.fullname" .ctx) .role) }}
{{- range $key, $value := $t.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%s" $key $value) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- end -}}
{{- end -}}

{{/* The Temporal flags the reconciler and the workers share, and the files they name. */}}
{{- define "plnt.temporalArgs" -}}
- --temporal-address
- {{ .Values.temporal.address | quote }}
- --temporal-namespace
- {{ .Values.temporal.namespace | quote }}
{{- with .Values.temporal.tls.secretName }}
- --temporal-tls-cert
- /etc/plnt/temporal-tls/{{ $.Values.temporal.tls.certKey }}
- --temporal-tls-key
- /etc/plnt/temporal-tls/{{ $.Values.temporal.tls.keyKey }}
{{- with $.Values.temporal.tls.caKey }}
- --temporal-tls-ca
- /etc/plnt/temporal-tls/{{ . }}
{{- end }}
{{- end }}
{{- with .Values.temporal.apiKey.secretName }}
- --temporal-api-key-file
- /etc/plnt/temporal-api-key/{{ $.Values.temporal.apiKey.key }}
{{- end }}
{{- end -}}

{{- define "plnt.temporalMounts" -}}
{{- if .Values.temporal.tls.secretName }}
- name: temporal-tls
  mountPath: /etc/plnt/temporal-tls
  readOnly: true
{{- end }}
{{- if .Values.temporal.apiKey.secretName }}
- name: temporal-api-key
  mountPath: /etc/plnt/temporal-api-key
  readOnly: true
{{- end }}
{{- end -}}

{{- define "plnt.temporalVolumes" -}}
{{- with .Values.temporal.tls.secretName }}
- name: temporal-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - {key: {{ $.Values.temporal.tls.certKey }}, path: {{ $.Values.temporal.tls.certKey }}}
      - {key: {{ $.Values.temporal.tls.keyKey }}, path: {{ $.Values.temporal.tls.keyKey }}}
      {{- with $.Values.temporal.tls.caKey }}
      - {key: {{ . }}, path: {{ . }}}
      {{- end }}
{{- end }}
{{- with .Values.temporal.apiKey.secretName }}
- name: temporal-api-key
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - {key: {{ $.Values.temporal.apiKey.key }}, path: {{ $.Values.temporal.apiKey.key }}}
{{- end }}
{{- end -}}

{{/* A Secret volume with one key: (dict "name" "internal-token" "secret" NAME "key" KEY). */}}
{{- define "plnt.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      - {key: {{ .key }}, path: {{ .key }}}
{{- end -}}

{{/*
Probes on the role's named port "http": liveness (and startup) on GET /healthz, readiness on the
path given: (dict "ready" "/readyz"). The reconciler's /readyz fails on a standby, so its Service
routes the control API to the Lease holder only.
*/}}
{{- define "plnt.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  httpGet: {path: {{ .ready }}, port: http}
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* Egress rules {to, ports} from a values entry; an empty `to` is any address on those ports. */}}
{{- define "plnt.egressRule" -}}
- ports:
    {{- toYaml .ports | nindent 4 }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Peers: this release's pods of one role in plnt's namespace, seen from any namespace. */}}
{{- define "plnt.rolePeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .ctx.Release.Namespace }}
  podSelector:
    matchLabels:
      {{- include "plnt.selectorLabels" . | nindent 6 }}
{{- end -}}

{{/*
The labels the workflow-runner chart puts on every runner pod (its selectorLabels/labels):
`app.kubernetes.io/name: workflow-runner` and `app.kubernetes.io/part-of: plnt`. Checked against a
render of that chart by tests/charts/test_plnt_chart.py.
*/}}
{{- define "plnt.runnerPodLabels" -}}
app.kubernetes.io/name: workflow-runner
app.kubernetes.io/part-of: plnt
{{- end -}}

{{/*
The labels the model-server chart puts on every model-server pod (its selectorLabels/labels):
`app.kubernetes.io/name: model-server` and `app.kubernetes.io/part-of: plnt`; its server listens on
8000, fixed in that chart (plnt's Helm driver routes to its Service on 8000). Both checked against a
render of that chart by tests/charts/test_plnt_chart.py.
*/}}
{{- define "plnt.modelServerPodLabels" -}}
app.kubernetes.io/name: model-server
app.kubernetes.io/part-of: plnt
{{- end -}}

{{- define "plnt.modelServerPort" -}}
8000
{{- end -}}

{{/*
Egress to the pods the workers deploy, in every deploy namespace, on their port:
(dict "ctx" $ "labels" "plnt.runnerPodLabels" "port" 8080).
*/}}
{{- define "plnt.deployedPodEgress" -}}
- to:
    {{- range .ctx.Values.deployNamespaces }}
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ . }}
      podSelector:
        matchLabels:
          {{- include $.labels $.ctx | nindent 10 }}
    {{- end }}
  ports:
    - {port: {{ .port }}, protocol: TCP}
{{- end -}}

{{/* Egress to the runner pods and the model-server pods of every deploy namespace (gateway, worker). */}}
{{- define "plnt.deployedPodsEgress" -}}
{{ include "plnt.deployedPodEgress" (dict "ctx" . "labels" "plnt.runnerPodLabels" "port" .Values.runners.port) }}
{{ include "plnt.deployedPodEgress" (dict "ctx" . "labels" "plnt.modelServerPodLabels" "port" (include "plnt.modelServerPort" .)) }}
{{- end -}}

{{/*
The policy of the pods the workers deploy, in one deploy namespace: in on their port from this
release's gateways and workers only; out to DNS, the registries (their init container fetches the
recipe or the weights) and the extra egress rules given.
(dict "ctx" $ "namespace" NS "name" "runners" "labels" "plnt.runnerPodLabels" "port" 8080 "egress" LIST)
*/}}
{{- define "plnt.deployedPodPolicy" -}}
{{- $np := .ctx.Values.networkPolicy -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "plnt.fullname" .ctx }}-{{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "plnt.commonLabels" .ctx | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include .labels .ctx | nindent 6 }}
  policyTypes: ["Ingress", "Egress"]
  ingress:
    - from:
        {{- include "plnt.rolePeer" (dict "ctx" .ctx "role" "gateway") | nindent 8 }}
        {{- include "plnt.rolePeer" (dict "ctx" .ctx "role" "worker") | nindent 8 }}
      ports:
        - {port: {{ .port }}, protocol: TCP}
  egress:
    {{- include "plnt.egressRule" $np.dns | nindent 4 }}
    {{- include "plnt.egressRule" $np.registries | nindent 4 }}
    {{- range .egress }}
    {{- include "plnt.egressRule" . | nindent 4 }}
    {{- end }}
{{- end -}}


{{/*
--verify-commits (reconciler and worker): the flags, their Secret mounts and volumes.
*/}}
{{- define "plnt.verifyArgs" -}}
{{- $v := .Values.git.verifyCommits -}}
{{- if ne $v.mode "none" -}}
{{- if not (or $v.allowedSigners.secretName $v.gpgKeys.secretName) -}}
{{- fail "git.verifyCommits.mode needs trusted signers: set git.verifyCommits.allowedSigners.secretName and/or git.verifyCommits.gpgKeys.secretName" -}}
{{- end -}}
- --verify-commits
- {{ $v.mode }}
{{- if $v.allowedSigners.secretName }}
- --allowed-signers
- /etc/plnt/allowed-signers/{{ $v.allowedSigners.key }}
{{- end }}
{{- if $v.gpgKeys.secretName }}
- --gpg-keys
- /etc/plnt/gpg-keys
{{- end }}
{{- end -}}
{{- end -}}

{{- define "plnt.verifyMounts" -}}
{{- $v := .Values.git.verifyCommits -}}
{{- if and (ne $v.mode "none") $v.allowedSigners.secretName }}
- {name: allowed-signers, mountPath: /etc/plnt/allowed-signers, readOnly: true}
{{- end }}
{{- if and (ne $v.mode "none") $v.gpgKeys.secretName }}
- {name: gpg-keys, mountPath: /etc/plnt/gpg-keys, readOnly: true}
{{- end }}
{{- end -}}

{{- define "plnt.verifyVolumes" -}}
{{- $v := .Values.git.verifyCommits -}}
{{- if and (ne $v.mode "none") $v.allowedSigners.secretName }}
{{ include "plnt.secretVolume" (dict "name" "allowed-signers" "secret" $v.allowedSigners.secretName "key" $v.allowedSigners.key) }}
{{- end }}
{{- if and (ne $v.mode "none") $v.gpgKeys.secretName }}
- name: gpg-keys
  secret:
    secretName: {{ $v.gpgKeys.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}


{{/*
The forge (reconciler): --forge and its options, the token's Secret mount and volume; --write-notes.
*/}}
{{- define "plnt.forgeArgs" -}}
{{- $f := .Values.forge -}}
{{- if $f.kind -}}
{{- if not (and $f.apiUrl $f.project $f.token.secretName) -}}
{{- fail "forge.kind needs forge.apiUrl, forge.project and forge.token.secretName" -}}
{{- end -}}
- --forge
- {{ $f.kind }}
- --forge-api-url
- {{ $f.apiUrl | quote }}
- --forge-project
- {{ $f.project | quote }}
- --forge-token-file
- /etc/plnt/forge-token/{{ $f.token.key }}
{{- if $f.requireApproval }}
- --require-approval
{{- end }}
{{- if not $f.reportStatus }}
- --no-report-status
{{- end }}
{{- range $f.previews }}
- --previews
- {{ . | quote }}
{{- end }}
{{- else if or $f.requireApproval $f.previews -}}
{{- fail "forge.requireApproval and forge.previews need a forge: set forge.kind, forge.apiUrl, forge.project and forge.token.secretName" -}}
{{- end }}
{{- if .Values.git.writeNotes }}
- --write-notes
{{- end }}
{{- end -}}

{{- define "plnt.forgeMounts" -}}
{{- if .Values.forge.kind }}
- {name: forge-token, mountPath: /etc/plnt/forge-token, readOnly: true}
{{- end }}
{{- end -}}

{{- define "plnt.forgeVolumes" -}}
{{- if .Values.forge.kind }}
{{ include "plnt.secretVolume" (dict "name" "forge-token" "secret" .Values.forge.token.secretName "key" .Values.forge.token.key) }}
{{- end }}
{{- end -}}

{{/*
"true" when the workers' Role grants list on the kinds of plnt's releases (rbac.worker.listForWait):
helm's --wait informers list before they watch on API servers without watch-list (Kubernetes < 1.34,
or its WatchList feature off).
*/}}
{{- define "plnt.workerListsForWait" -}}
{{- $mode := toString .Values.rbac.worker.listForWait -}}
{{- if eq $mode "true" -}}true
{{- else if eq $mode "auto" -}}{{- if semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- else if ne $mode "false" -}}{{- fail (printf "rbac.worker.listForWait must be auto, true or false, not %q" $mode) -}}
{{- end -}}
{{- end -}}


{{/*
The spec source (reconciler and worker). git: --repo, --branch, --path. kubernetes: --source
kubernetes, each --source-namespace (none: every namespace) and the platform ConfigMap as
--platform-dir, mounted read-only; plnt's own checks refuse git's options with it, and so does the
chart (plnt.kubernetesSourceGuards), so that no option is dropped silently.
*/}}
{{- define "plnt.platformDir" -}}
/etc/plnt/platform
{{- end -}}

{{- define "plnt.kubernetesSourceGuards" -}}
{{- $ := . -}}
{{- $_ := required "source.platformConfigMap is required with source.kind kubernetes: a ConfigMap in plnt's namespace holding the PlntBackends, RecipeTrustPolicies and trusted roots (never read from the cluster's custom resources)" .Values.source.platformConfigMap -}}
{{- $gitOnly := list -}}
{{- range $option, $on := dict "git.repo" .Values.git.repo "git.credentials.secretName" .Values.git.credentials.secretName "git.webhookSecret.secretName" .Values.git.webhookSecret.secretName "git.verifyCommits.mode" (ne .Values.git.verifyCommits.mode "none") "git.writeNotes" .Values.git.writeNotes "forge.kind" .Values.forge.kind "forge.requireApproval" .Values.forge.requireApproval "forge.previews" .Values.forge.previews "mirrorStatus.enabled" .Values.mirrorStatus.enabled "ingress.hooks.enabled" (and .Values.ingress.enabled .Values.ingress.hooks.enabled) -}}
{{- if $on -}}{{- $gitOnly = append $gitOnly $option -}}{{- end -}}
{{- end -}}
{{- if $gitOnly -}}
{{- fail (printf "%s %s for source.kind git: with source.kind kubernetes there are no commits or pull requests, the cluster's RBAC on WorkflowRuns is the approval, and their status is written onto them without mirrorStatus (docs/kubernetes.md)" (join ", " $gitOnly) (ternary "is" "are" (eq (len $gitOnly) 1))) -}}
{{- end -}}
{{- end -}}

{{- define "plnt.sourceArgs" -}}
{{- if eq .Values.source.kind "kubernetes" -}}
- --source
- kubernetes
{{- range .Values.source.namespaces }}
- --source-namespace
- {{ . | quote }}
{{- end }}
- --platform-dir
- {{ include "plnt.platformDir" . }}
{{- else -}}
- --repo
- {{ .Values.git.repo | quote }}
- --branch
- {{ .Values.git.branch | quote }}
- --path
- {{ .Values.git.path | quote }}
{{- end -}}
{{- end -}}

{{/* source.kind kubernetes: the platform ConfigMap, read-only, as --platform-dir. */}}
{{- define "plnt.sourceMounts" -}}
- {name: platform, mountPath: {{ include "plnt.platformDir" . }}, readOnly: true}
{{- end -}}

{{- define "plnt.sourceVolumes" -}}
- name: platform
  configMap:
    name: {{ .Values.source.platformConfigMap }}
    defaultMode: 0440
    {{- with .Values.source.platformItems }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end -}}

{{/*
The rules of source.kind kubernetes for one role ("reconciler" or "worker"): exactly the "source"
entries of reconciler/control/kube_calls.py (checked by tests/charts/test_plnt_rbac.py).
*/}}
{{- define "plnt.sourceRules" -}}
{{- if eq . "reconciler" -}}
# The objects plnt deploys: listed each poll, watched to wake the loop when one changes.
- apiGroups: ["plnt.work"]
  resources: ["workflowruns", "modeldeployments"]
  verbs: ["list", "watch"]
# Each WorkflowRun's status, through the status subresource: never its spec.
- apiGroups: ["plnt.work"]
  resources: ["workflowruns/status"]
  verbs: ["patch"]
# An Event on each phase change (`kubectl describe wfr`).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- else -}}
# A saga's input is checked against the objects as the cluster lists them now.
- apiGroups: ["plnt.work"]
  resources: ["workflowruns", "modeldeployments"]
  verbs: ["list"]
{{- end -}}
{{- end -}}
