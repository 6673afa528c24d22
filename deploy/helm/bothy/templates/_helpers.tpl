{{/*
The names are fixed rather than derived from the release: the CRDs, the BothyNodes and the
ClusterRoles (named by controller-gen) are cluster-wide, so a cluster holds one bothy release.
*/}}

{{/* Labels every object carries. */}}
{{- define "bothy.labels" -}}
app.kubernetes.io/name: bothy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "bothy.imageTag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The selector of one part's pods (immutable once installed): call with (list $ "node"). */}}
{{- define "bothy.selector" -}}
app.kubernetes.io/name: bothy
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "bothy.imageTag" -}}
{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "bothy.image" -}}
{{ printf "%s:%s" .Values.image.repository (include "bothy.imageTag" .) }}
{{- end }}

{{/*
The Secret that holds a token, checked: call with (list $ "router"), (list $ "node") or, when
bothy.hasOperator, (list $ "operator"). The chart has no default token, and it refuses one
shorter than bothyd accepts (16 characters), so that a bad token fails the install rather
than every pod's start.
*/}}
{{- define "bothy.tokenSecret" -}}
{{- $ := index . 0 -}}
{{- $part := index . 1 -}}
{{- $t := index $.Values.tokens $part -}}
{{- $what := ternary "clients present to the routers" "the routers present to the nodes" (eq $part "router") -}}
{{- if and $t.value $t.existingSecret -}}
{{- fail (printf "tokens.%s: give either tokens.%s.value or tokens.%s.existingSecret, not both" $part $part $part) -}}
{{- else if $t.existingSecret -}}
{{- $t.existingSecret -}}
{{- else if $t.value -}}
{{- if lt (len (trim $t.value)) 16 -}}
{{- fail (printf "tokens.%s.value is shorter than 16 characters; use a long random one, e.g. `head -c 32 /dev/urandom | base64`" $part) -}}
{{- end -}}
bothy-{{ $part }}-token
{{- else -}}
{{- fail (printf "tokens.%s is required: the token %s. Give it with --set-file tokens.%s.value=<file>, or name a Secret you made in the release's namespace with --set tokens.%s.existingSecret=<name> (its key tokens.%s.existingSecretKey, default token, holds the token). The chart has no default token." $part $what $part $part $part) -}}
{{- end -}}
{{- end }}

{{/* Whether the operator's token is given (it is optional): "true" or "". */}}
{{- define "bothy.hasOperator" -}}
{{- if or .Values.tokens.operator.value .Values.tokens.operator.existingSecret }}true{{ end -}}
{{- end }}

{{/* The key of a token's Secret that holds it: call with (list $ "router"). */}}
{{- define "bothy.tokenKey" -}}
{{- $t := index (index . 0).Values.tokens (index . 1) -}}
{{- if $t.existingSecret }}{{ $t.existingSecretKey | default "token" }}{{ else }}token{{ end -}}
{{- end }}

{{/* The restricted security context of the router's and the controller's containers. */}}
{{- define "bothy.restricted" -}}
runAsNonRoot: true
runAsUser: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end }}
