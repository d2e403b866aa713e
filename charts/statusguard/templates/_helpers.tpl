{{/* The release's full name, at most 63 characters: fullnameOverride, or the release name with the chart's name (nameOverride) appended unless it holds it. */}}
{{- define "statusguard.fullname" -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The image: repository@digest when a digest is set, else repository:tag. */}}
{{- define "statusguard.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "statusguard.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
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
{{- $ips := .Values.certificates.extraIPs -}}
{{- with include "statusguard.urlHost" . -}}
{{- if regexMatch "^[0-9.]+$|:" . -}}
{{- $ips = append $ips . | uniq -}}
{{- else -}}
{{- $dns = append $dns . | uniq -}}
{{- end -}}
{{- end -}}
{{- $ca := genCA (printf "%s-ca" $service) (int .Values.certificates.validityDays) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service .Release.Namespace) $ips $dns (int .Values.certificates.validityDays) $ca -}}
{{- $certs = dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key -}}
{{- end -}}
{{- $_ := set .Values "__statusguardCertificates" $certs -}}
{{- end -}}
{{- get .Values "__statusguardCertificates" | toJson -}}
{{- end -}}

{{/* The host of webhook.url (empty without one): the host the API server dials must be in every generated certificate. */}}
{{- define "statusguard.urlHost" -}}
{{- with .Values.webhook.url -}}
{{- $hostport := (urlParse .).host -}}
{{- if hasPrefix "[" $hostport -}}
{{- $hostport | trimPrefix "[" | splitList "]" | first -}}
{{- else -}}
{{- splitList ":" $hostport | first -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of the webhook configurations the server keeps in step with the ownership document: cluster-scoped, so it holds the namespace (two releases of one name in two namespaces must not share them). */}}
{{- define "statusguard.webhookName" -}}
{{- printf "%s-%s" (include "statusguard.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* host:port for a --listen flag: listenAddress (an IPv6 address in brackets) and the port given. */}}
{{- define "statusguard.listen" -}}
{{- $address := index . 0 -}}
{{- if contains ":" $address -}}
{{- printf "[%s]:%v" $address (index . 1) -}}
{{- else -}}
{{- printf "%s:%v" $address (index . 1) -}}
{{- end -}}
{{- end -}}

{{/* Where the server finds the CA bundle it writes into its webhook configurations. */}}
{{- define "statusguard.caFile" -}}
{{- if eq .Values.certificates.mode "server" -}}
{{- else if eq .Values.certificates.mode "existingSecret" -}}
/etc/statusguard/ca/ca.crt
{{- else -}}
/etc/statusguard/tls/ca.crt
{{- end -}}
{{- end -}}

{{/* Where the API server sends reviews: the Service, or webhook.url. */}}
{{- define "statusguard.webhookTarget" -}}
{{- if .Values.webhook.url -}}
{{- .Values.webhook.url -}}
{{- else -}}
{{- printf "%s/%s:%v" .Release.Namespace (include "statusguard.fullname" .) .Values.service.port -}}
{{- end -}}
{{- end -}}

{{/* The webhooks' namespaceSelector, as JSON: never the release's own namespace, the excluded ones, or an opted-out one. */}}
{{- define "statusguard.namespaceSelector" -}}
{{- $excluded := prepend .Values.webhook.excludeNamespaces .Release.Namespace | uniq -}}
{{- $byName := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded -}}
{{- $optOut := dict "key" .Values.webhook.optOutLabel "operator" "NotIn" "values" (list "true") -}}
{{- dict "matchExpressions" (list $byName $optOut) | toJson -}}
{{- end -}}

{{/* What a change of rolls the pods: the certificate source. */}}
{{- define "statusguard.certificateChecksum" -}}
{{- if eq .Values.certificates.mode "helm" -}}
{{- include "statusguard.helmCertificates" . | sha256sum -}}
{{- else -}}
{{- printf "%s/%s/%s" .Values.certificates.mode .Values.certificates.existingSecret .Values.certificates.caBundle | sha256sum -}}
{{- end -}}
{{- end -}}
