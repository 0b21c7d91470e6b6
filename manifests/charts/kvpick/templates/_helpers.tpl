{{/* The picker's objects: <release>-epp, as the reference chart names them (63-character DNS labels). */}}
{{- define "kvpick.name" -}}
{{- printf "%s-epp" (.Release.Name | trunc 59 | trimSuffix "-") -}}
{{- end -}}

{{- define "kvpick.selectorLabels" -}}
app.kubernetes.io/name: kvpick
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvpick.labels" -}}
{{ include "kvpick.selectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The InferencePool's API group, from inferencePool.apiVersion. */}}
{{- define "kvpick.poolGroup" -}}
{{- (split "/" .Values.inferencePool.apiVersion)._0 -}}
{{- end -}}

{{/* Leader election: on with more than one replica (active-passive), as in the reference chart. */}}
{{- define "kvpick.ha" -}}
{{- if and (gt (int .Values.inferenceExtension.replicas) 1) (ne .Values.inferenceExtension.highAvailability "active") }}true{{ end -}}
{{- end -}}

{{/* The headless Service of active-active replicas: a DNS label, at most 63 characters. */}}
{{- define "kvpick.peersName" -}}
{{- printf "%s-epp-peers" (.Release.Name | trunc 53 | trimSuffix "-") -}}
{{- end -}}

{{/* Active-active replicas: each shares its commits with the others (--peers). */}}
{{- define "kvpick.activeActive" -}}
{{- if and (gt (int .Values.inferenceExtension.replicas) 1) (eq .Values.inferenceExtension.highAvailability "active") }}true{{ end -}}
{{- end -}}

{{/* The file --config-file names, inside the ConfigMap mounted at /config. */}}
{{- define "kvpick.configFile" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $f := $ie.pluginsConfigFile | default "" -}}
{{- if or (eq $f "") (eq $f "config.yaml") (and (eq $f "default-plugins.yaml") (not (hasKey $ie.pluginsCustomConfig $f))) -}}
config.yaml
{{- else if hasKey $ie.pluginsCustomConfig $f -}}
{{ $f }}
{{- else -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile %q is not a key of inferenceExtension.pluginsCustomConfig (keys: %v)" $f (keys $ie.pluginsCustomConfig | sortAlpha)) -}}
{{- end -}}
{{- end -}}

{{/* kvpick's own configuration file: inferenceExtension.config, with modelServerType as pool.metrics.engine unless the config sets one. */}}
{{- define "kvpick.configYAML" -}}
{{- $cfg := deepCopy (.Values.inferenceExtension.config | default dict) -}}
{{- with .Values.inferencePool.modelServerType -}}
{{- $pool := get $cfg "pool" | default dict -}}
{{- $metrics := get $pool "metrics" | default dict -}}
{{- if not (hasKey $metrics "engine") -}}
{{- $_ := set $metrics "engine" . -}}
{{- $_ := set $pool "metrics" $metrics -}}
{{- $_ := set $cfg "pool" $pool -}}
{{- end -}}
{{- end -}}
{{- if $cfg -}}
{{ toYaml $cfg }}
{{- else -}}
# Empty: the picker's built-in defaults (config/default.yaml, `extproc --print-default-config`).
{}
{{- end -}}
{{- end -}}

{{/* Checks that stop a render with a message naming the value to fix. */}}
{{- define "kvpick.validate" -}}
{{- if not .Values.inferencePool.modelServers.matchLabels -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels of your model server pods, e.g. --set inferencePool.modelServers.matchLabels.app=vllm-llama3-8b" -}}
{{- end -}}
{{- if or (not .Values.inferenceExtension.image.hub) (not .Values.inferenceExtension.image.tag) -}}
{{- fail "inferenceExtension.image.hub and .tag are required: no kvpick image is published. Build and push yours with `make image IMAGE=<registry>/kvpick:<tag> PUSH=1`, then --set inferenceExtension.image.hub=<registry> --set inferenceExtension.image.tag=<tag>" -}}
{{- end -}}
{{- $managed := dict "pool-name" "the release name" "pool-namespace" "the release namespace" "pool-group" "inferencePool.apiVersion" "grpc-port" "the chart (9002)" "grpc-health-port" "the chart (9003)" "metrics-port" "the chart (9090)" "config-file" "inferenceExtension.config or pluginsConfigFile" "ha-enable-leader-election" "inferenceExtension.replicas and highAvailability" "peers" "inferenceExtension.highAvailability: active" "drain-timeout" "inferenceExtension.drainTimeoutSeconds" "shutdown-delay" "inferenceExtension.shutdownDelaySeconds" "secure-serving" "inferenceExtension.tls.enabled" "cert-path" "inferenceExtension.tls.secretName" "log-level" "inferenceExtension.logLevel" "endpoints" "nothing: the pool comes from the InferencePool" -}}
{{- range $flag, $_ := .Values.inferenceExtension.flags -}}
{{- $name := trimPrefix "-" (trimPrefix "-" $flag) -}}
{{- if hasKey $managed $name -}}
{{- fail (printf "inferenceExtension.flags.%s: the chart sets --%s itself; use %s" $flag $name (get $managed $name)) -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.inferencePool.apiVersion "inference.networking.x-k8s.io/v1alpha2") (gt (len .Values.inferencePool.targetPorts) 1) -}}
{{- fail "inferencePool.targetPorts: a v1alpha2 InferencePool takes one port (targetPortNumber); use inference.networking.k8s.io/v1 for several" -}}
{{- end -}}
{{- end -}}
