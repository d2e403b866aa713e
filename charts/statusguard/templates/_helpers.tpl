{{/* The release's full name, at most 63 characters. */}}
{{- define "statusguard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "statusguard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "statusguard.labels" -}}
{{ include "statusguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "statusguard.serviceAccountName" -}}
{{- default (include "statusguard.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "statusguard.configMapName" -}}
{{- printf "%s-ownership" (include "statusguard.fullname" .) -}}
{{- end -}}

{{- define "statusguard.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- .Values.certificates.existingSecret -}}
{{- else -}}
{{- printf "%s-tls" (include "statusguard.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when any resource is in trim mode: only then is there a mutating webhook. */}}
{{- define "statusguard.needsMutating" -}}
{{- $default := default "enforce" .Values.ownership.mode -}}
{{- range .Values.ownership.resources -}}
{{- if eq (default $default .mode) "trim" -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The serving certificate of helm mode as JSON {ca, crt, key}: the one in the
existing Secret when there is one (kept across upgrades), else a new CA and
certificate. Computed once per render and remembered, so that the Secret, the
webhooks' caBundle and the Deployment's checksum agree.
*/}}
{{- define "statusguard.helmCertificates" -}}
{{- if not (hasKey .Values "__statusguardCertificates") -}}
{{- $name := include "statusguard.tlsSecretName" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $certs := dict -}}
{{- if and $existing $existing.data (hasKey $existing.data "ca.crt") (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") -}}
{{- $certs = dict "ca" (index $existing.data "ca.crt" | b64dec) "crt" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $service := include "statusguard.fullname" . -}}
{{- $dns := list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) -}}
{{- $dns = concat $dns .Values.certificates.extraDNSNames -}}
{{- $ca := genCA (printf "%s-ca" $service) (int .Values.certificates.validityDays) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service .Release.Namespace) .Values.certificates.extraIPs $dns (int .Values.certificates.validityDays) $ca -}}
{{- $certs = dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key -}}
{{- end -}}
{{- $_ := set .Values "__statusguardCertificates" $certs -}}
{{- end -}}
{{- get .Values "__statusguardCertificates" | toJson -}}
{{- end -}}

{{/* The caBundle of the webhook configurations (empty in certManager mode: injected). */}}
{{- define "statusguard.caBundle" -}}
{{- if eq .Values.certificates.mode "helm" -}}
{{- (include "statusguard.helmCertificates" . | fromJson).ca | b64enc -}}
{{- else if eq .Values.certificates.mode "existingSecret" -}}
{{- .Values.certificates.caBundle -}}
{{- end -}}
{{- end -}}

{{/* What a change of rolls the pods: the certificate source. */}}
{{- define "statusguard.certificateChecksum" -}}
{{- if eq .Values.certificates.mode "helm" -}}
{{- include "statusguard.helmCertificates" . | sha256sum -}}
{{- else -}}
{{- printf "%s/%s/%s" .Values.certificates.mode .Values.certificates.existingSecret .Values.certificates.caBundle | sha256sum -}}
{{- end -}}
{{- end -}}
