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

{{/*
A name of at most 63 characters (a DNS label, as Service, Job and label
values need): the name itself when it fits, else its first 54 characters and
8 of its hash, so that two long names never meet. Names that fit are never
changed: an upgrade renames nothing.
*/}}
{{- define "statusguard.boundedName" -}}
{{- if le (len .) 63 -}}
{{- . -}}
{{- else -}}
{{- printf "%s-%s" (trunc 54 . | trimSuffix "-") (sha256sum . | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/* The full name with a suffix, bounded: (list $ "suffix"). */}}
{{- define "statusguard.suffixedName" -}}
{{- include "statusguard.boundedName" (printf "%s-%s" (include "statusguard.fullname" (index . 0)) (index . 1)) -}}
{{- end -}}

{{/* The ServiceAccount the pods run as: the chart's (its full name unless serviceAccount.name), or, with serviceAccount.create false, one of yours by name. */}}
{{- define "statusguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "statusguard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.create=false needs serviceAccount.name: the ServiceAccount of yours the pods run as" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "statusguard.configMapName" -}}
{{- include "statusguard.suffixedName" (list . "ownership") -}}
{{- end -}}

{{/*
The Secret the serving certificate is read from: one name per mode, because a
Secret's type cannot change (server: Opaque, created empty; helm and
cert-manager: kubernetes.io/tls) and because Helm deletes what a mode no
longer renders after the next one has written it. Server mode keeps the
historical name, so an upgrade keeps the CA the server made.
*/}}
{{- define "statusguard.tlsSecretName" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if eq $mode "existingSecret" -}}
{{- .Values.certificates.existingSecret -}}
{{- else if eq $mode "helm" -}}
{{- include "statusguard.suffixedName" (list . "helm-tls") -}}
{{- else if eq $mode "certManager" -}}
{{- include "statusguard.suffixedName" (list . "cert-manager-tls") -}}
{{- else -}}
{{- include "statusguard.suffixedName" (list . "tls") -}}
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
{{- if not $existing -}}
{{- /* A release from before the per-mode names kept helm mode's Secret at <fullname>-tls: its CA carries over, so the upgrade swaps no trust. */ -}}
{{- $previous := lookup "v1" "Secret" .Release.Namespace (include "statusguard.suffixedName" (list . "tls")) -}}
{{- if and $previous (eq (get $previous "type" | toString) "kubernetes.io/tls") -}}
{{- $existing = $previous -}}
{{- end -}}
{{- end -}}
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
{{- $ca := genCA (include "statusguard.suffixedName" (list . "ca")) (int .Values.certificates.validityDays) -}}
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
{{- include "statusguard.boundedName" (printf "%s-%s" (include "statusguard.fullname" .) .Release.Namespace) -}}
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

{{/* The webhooks' namespaceSelector, as JSON: never the release's own namespace, kube-system (always: a value of yours adds to it, never replaces it), the excluded ones, or an opted-out one. */}}
{{- define "statusguard.namespaceSelector" -}}
{{- $excluded := concat (list .Release.Namespace "kube-system") .Values.webhook.excludeNamespaces | uniq -}}
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


{{/*
The Deployment's strategy: updateStrategy when set. Else, when replicas must
sit on distinct nodes (hostNetwork's ports, or a required pod anti-affinity of
yours), replace one pod at a time without a surge (maxSurge 0,
maxUnavailable 1): a surge pod would find no node once usable nodes equal
replicas, and the rollout would wait for ever. Otherwise surge first
(maxSurge 1, maxUnavailable 0): the soft anti-affinity lets the new pod share
a node, and no ready replica is taken away before its successor is ready.
*/}}
{{- define "statusguard.updateStrategy" -}}
{{- if .Values.updateStrategy -}}
{{- toYaml .Values.updateStrategy -}}
{{- else -}}
{{- $required := false -}}
{{- with .Values.affinity -}}{{- with .podAntiAffinity -}}{{- if .requiredDuringSchedulingIgnoredDuringExecution -}}{{- $required = true -}}{{- end -}}{{- end -}}{{- end -}}
{{- if or .Values.hostNetwork $required -}}
type: RollingUpdate
rollingUpdate:
  maxSurge: 0
  maxUnavailable: 1
{{- else -}}
type: RollingUpdate
rollingUpdate:
  maxSurge: 1
  maxUnavailable: 0
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod labels: podLabels, then the selector labels, which podLabels cannot replace (the schema refuses them too). */}}
{{- define "statusguard.podLabels" -}}
{{- with omit .Values.podLabels "app.kubernetes.io/name" "app.kubernetes.io/instance" -}}
{{ toYaml . }}
{{ end -}}
{{ include "statusguard.selectorLabels" . }}
{{- end -}}

{{/* Who may reach the admin port (/metrics): networkPolicy.metricsFrom when given (also []); else, with a ServiceMonitor or PodMonitor, pods of any namespace (Prometheus runs in a namespace of its own, which the chart cannot know); else the release namespace's pods. */}}
{{- define "statusguard.metricsFrom" -}}
{{- $from := .Values.networkPolicy.metricsFrom -}}
{{- if kindIs "slice" $from -}}
{{- toJson $from -}}
{{- else if or .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- toJson (list (dict "namespaceSelector" dict)) -}}
{{- else -}}
{{- toJson (list (dict "podSelector" dict)) -}}
{{- end -}}
{{- end -}}

{{/* The PromQL label matchers of this release's scrape targets: metrics.prometheusRule.targetSelector, or the jobs the chart's ServiceMonitor (the metrics Service's name) and PodMonitor (namespace/name) give. */}}
{{- define "statusguard.targetSelector" -}}
{{- with .Values.metrics.prometheusRule.targetSelector -}}
{{- . -}}
{{- else -}}
{{- printf "namespace=%q,job=~%q" .Release.Namespace (printf "%s|%s/%s" (include "statusguard.suffixedName" (list . "metrics")) .Release.Namespace (include "statusguard.fullname" .)) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the pod mounts its serving certificate from a Secret (the
webhook engine, certificates not kept by the server); empty otherwise.
*/}}
{{- define "statusguard.tlsVolume" -}}
{{- if and (eq .Values.engine "webhook") (ne .Values.certificates.mode "server") }}true{{ end }}
{{- end }}
