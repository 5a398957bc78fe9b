{{/*
Every object is named after the release: plnt installs `<name>` (stable) and `<name>-canary`
(canary), so both tracks of one ModelDeployment coexist in one namespace.
*/}}
{{- define "model-server.fullname" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" .Release.Name) -}}
{{- fail (printf "release name %q must be a DNS-1035 label (it names a Service)" .Release.Name) -}}
{{- end -}}
{{- if gt (len .Release.Name) 53 -}}
{{- fail (printf "release name %q is longer than 53 characters" .Release.Name) -}}
{{- end -}}
{{- .Release.Name -}}
{{- end -}}

{{/* A model version as a label value: `+` is not allowed there, and values end alphanumeric. */}}
{{- define "model-server.versionLabel" -}}
{{- $v := .Values.model.version | replace "+" "_" | trunc 63 -}}
{{- regexReplaceAll "[^A-Za-z0-9]+$" $v "" -}}
{{- end -}}

{{/* The selector: never changes for a release (Deployment selectors are immutable). */}}
{{- define "model-server.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
plnt.work/model-deployment: {{ .Values.deployment.name }}
plnt.work/track: {{ .Values.track }}
{{- end -}}

{{/* The spec fingerprint in a label: its first 12 hex digits (a label value holds no `:`), as in the release id. */}}
{{- define "model-server.labels" -}}
{{ include "model-server.selectorLabels" . }}
app.kubernetes.io/version: {{ include "model-server.versionLabel" . | quote }}
app.kubernetes.io/component: model-server
app.kubernetes.io/part-of: plnt
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
plnt.work/model-deployment-namespace: {{ .Values.deployment.namespace }}
plnt.work/model: {{ .Values.model.name }}
plnt.work/runtime: {{ .Values.runtime.type | quote }}
plnt.work/spec-fingerprint: {{ substr 7 19 .Values.deployment.specFingerprint | quote }}
{{- end -}}

{{- define "model-server.trustConfigMap" -}}
{{ include "model-server.fullname" . }}-weights-trust
{{- end -}}

{{/*
The trustedRootFile paths, sorted, as a JSON list (ConfigMap key trusted-root-<index>.json). Each is
mounted at its own path beside policies.yaml, where `plnt model fetch` looks for it.
*/}}
{{- define "model-server.trustedRootPaths" -}}
{{- $paths := keys (.Values.weights.trustedRoots | default dict) | sortAlpha -}}
{{- range $paths -}}
{{- if or (hasPrefix "/" .) (regexMatch "(^|/)\\.\\.?(/|$)" .) (eq . "policies.yaml") -}}
{{- fail (printf "weights.trustedRoots: %q must be a relative path without . or .. segments, other than policies.yaml" .) -}}
{{- end -}}
{{- end -}}
{{- toJson $paths -}}
{{- end -}}

{{/* Which registry kind the weights come from: s3 or oci (a pod reaches no file: registry). */}}
{{- define "model-server.registryKind" -}}
{{- $registry := .Values.model.registry -}}
{{- if hasPrefix "s3://" $registry -}}s3
{{- else if hasPrefix "oci" $registry -}}oci
{{- else -}}
{{- fail (printf "model.registry %q: a model pod fetches its weights itself and reaches only s3:// or oci:// registries" $registry) -}}
{{- end -}}
{{- end -}}

{{/*
The extended resource the GPUs are counted in: gpu.resourceName; else the class when it looks like
`vendor.tld/resource` (a DNS subdomain with a dot, a slash, a name); else nvidia.com/gpu.
*/}}
{{- define "model-server.gpuResource" -}}
{{- $class := .Values.gpu.class | default "" -}}
{{- if .Values.gpu.resourceName -}}
{{- .Values.gpu.resourceName -}}
{{- else if regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $class -}}
{{- $class -}}
{{- else -}}
nvidia.com/gpu
{{- end -}}
{{- end -}}

{{/*
vLLM, TGI and SGLang serve on GPUs only; llama.cpp is the runtime that runs on CPU. The llama.cpp
model file must stay inside the model directory.
*/}}
{{/* "true" when a KEDA ScaledObject, not the chart's own HPA, scales the release (autoscaling.autoscaler). */}}
{{- define "model-server.keda" -}}
{{- $scaling := .Values.autoscaling | default dict -}}
{{- if and $scaling.targetInFlight (eq ($scaling.autoscaler | default "hpa") "keda") -}}true{{- end -}}
{{- end -}}

{{/*
PromQL of the requests in flight (running plus waiting) summed over this release's pods, from the
runtime's own series: the label matchers are the pods' namespace and name (<release>-<hash>-<suffix>:
the canary's pods never match the stable release's), as a Prometheus scraping pods labels each series.
*/}}
{{- define "model-server.inFlightQuery" -}}
{{- $pods := printf "namespace=%q,pod=~%q" .Release.Namespace (printf "%s-[a-z0-9]+-[a-z0-9]+" (include "model-server.fullname" .)) -}}
{{- $series := dict "llama.cpp" (list "llamacpp:requests_processing" "llamacpp:requests_deferred")
                    "vllm" (list "vllm:num_requests_running" "vllm:num_requests_waiting")
                    "sglang" (list "sglang:num_running_reqs" "sglang:num_queue_reqs")
                    "tgi" (list "tgi_batch_current_size" "tgi_queue_size") -}}
{{- $pair := get $series .Values.runtime.type -}}
{{- if not $pair -}}
{{- fail (printf "runtime.type %q: one of llama.cpp, vllm, tgi, sglang" .Values.runtime.type) -}}
{{- end -}}
{{- printf "sum(%s{%s}) + sum(%s{%s})" (index $pair 0) $pods (index $pair 1) $pods -}}
{{- end -}}

{{- define "model-server.checkRuntime" -}}
{{- $type := .Values.runtime.type -}}
{{- if and (ne $type "llama.cpp") (lt (int .Values.gpu.count) 1) -}}
{{- fail (printf "runtime.type %s serves on GPUs only: gpu.count (the ModelDeployment's spec.backend.gpuCount) must be at least 1, not %v; llama.cpp is the runtime that runs on CPU" $type (int .Values.gpu.count)) -}}
{{- end -}}
{{- if eq $type "llama.cpp" -}}
{{- $file := .Values.runtime.modelFile | default "" -}}
{{- if not $file -}}
{{- fail "runtime.modelFile: llama.cpp loads one .gguf file; name it, relative to the model directory (e.g. model.gguf)" -}}
{{- end -}}
{{- if or (hasPrefix "/" $file) (regexMatch "(^|/)\\.\\.?(/|$)" $file) -}}
{{- fail (printf "runtime.modelFile: %q must be a relative path without . or .. segments (inside the model directory)" $file) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Every container and init container: the `restricted` Pod Security Standard, stated per container. */}}
{{- define "model-server.containerSecurity" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
