package manifests

// The parts of the Kubernetes, Gateway API and Inference Extension schemas the manifests use.
// Documents are decoded into these with unknown fields refused, so a misspelt field
// (readinesProbe) fails here instead of being dropped or refused at apply time. A field the
// manifests start to use must be added here; `any` marks fields that are accepted unchecked.

type objectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type header struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
}

type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions any               `json:"matchExpressions,omitempty"`
}

type deployment struct {
	header
	Spec struct {
		Replicas                *int          `json:"replicas,omitempty"`
		Strategy                any           `json:"strategy,omitempty"`
		Selector                labelSelector `json:"selector"`
		Template                podTemplate   `json:"template"`
		RevisionHistoryLimit    *int          `json:"revisionHistoryLimit,omitempty"`
		MinReadySeconds         int           `json:"minReadySeconds,omitempty"`
		ProgressDeadlineSeconds *int          `json:"progressDeadlineSeconds,omitempty"`
	} `json:"spec"`
}

type podTemplate struct {
	Metadata objectMeta `json:"metadata"`
	Spec     podSpec    `json:"spec"`
}

type podSpec struct {
	ServiceAccountName            string      `json:"serviceAccountName,omitempty"`
	AutomountServiceAccountToken  *bool       `json:"automountServiceAccountToken,omitempty"`
	TerminationGracePeriodSeconds *int        `json:"terminationGracePeriodSeconds,omitempty"`
	SecurityContext               *podSecCtx  `json:"securityContext,omitempty"`
	InitContainers                []container `json:"initContainers,omitempty"`
	Containers                    []container `json:"containers"`
	Volumes                       []volume    `json:"volumes,omitempty"`
	NodeSelector                  any         `json:"nodeSelector,omitempty"`
	Tolerations                   any         `json:"tolerations,omitempty"`
	Affinity                      any         `json:"affinity,omitempty"`
	TopologySpreadConstraints     any         `json:"topologySpreadConstraints,omitempty"`
	PriorityClassName             string      `json:"priorityClassName,omitempty"`
}

type podSecCtx struct {
	RunAsNonRoot   *bool  `json:"runAsNonRoot,omitempty"`
	RunAsUser      *int64 `json:"runAsUser,omitempty"`
	RunAsGroup     *int64 `json:"runAsGroup,omitempty"`
	FSGroup        *int64 `json:"fsGroup,omitempty"`
	SeccompProfile *struct {
		Type string `json:"type"`
	} `json:"seccompProfile,omitempty"`
}

type container struct {
	Name            string        `json:"name"`
	Image           string        `json:"image"`
	ImagePullPolicy string        `json:"imagePullPolicy,omitempty"`
	Command         []string      `json:"command,omitempty"`
	Args            []string      `json:"args,omitempty"`
	Env             []envVar      `json:"env,omitempty"`
	EnvFrom         any           `json:"envFrom,omitempty"`
	Ports           []contPort    `json:"ports,omitempty"`
	LivenessProbe   *probe        `json:"livenessProbe,omitempty"`
	ReadinessProbe  *probe        `json:"readinessProbe,omitempty"`
	StartupProbe    *probe        `json:"startupProbe,omitempty"`
	Resources       *resources    `json:"resources,omitempty"`
	SecurityContext *contSecCtx   `json:"securityContext,omitempty"`
	VolumeMounts    []volumeMount `json:"volumeMounts,omitempty"`
	Lifecycle       any           `json:"lifecycle,omitempty"`
}

type envVar struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	ValueFrom any    `json:"valueFrom,omitempty"`
}

type contPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

type probe struct {
	GRPC *struct {
		Port    int     `json:"port"`
		Service *string `json:"service,omitempty"`
	} `json:"grpc,omitempty"`
	HTTPGet *struct {
		Path        string `json:"path,omitempty"`
		Port        any    `json:"port"`
		Scheme      string `json:"scheme,omitempty"`
		HTTPHeaders any    `json:"httpHeaders,omitempty"`
	} `json:"httpGet,omitempty"`
	TCPSocket *struct {
		Port any `json:"port"`
	} `json:"tcpSocket,omitempty"`
	Exec *struct {
		Command []string `json:"command"`
	} `json:"exec,omitempty"`
	InitialDelaySeconds int `json:"initialDelaySeconds,omitempty"`
	PeriodSeconds       int `json:"periodSeconds,omitempty"`
	TimeoutSeconds      int `json:"timeoutSeconds,omitempty"`
	SuccessThreshold    int `json:"successThreshold,omitempty"`
	FailureThreshold    int `json:"failureThreshold,omitempty"`
}

type resources struct {
	Requests map[string]any `json:"requests,omitempty"`
	Limits   map[string]any `json:"limits,omitempty"`
}

type contSecCtx struct {
	AllowPrivilegeEscalation *bool  `json:"allowPrivilegeEscalation,omitempty"`
	ReadOnlyRootFilesystem   *bool  `json:"readOnlyRootFilesystem,omitempty"`
	RunAsNonRoot             *bool  `json:"runAsNonRoot,omitempty"`
	RunAsUser                *int64 `json:"runAsUser,omitempty"`
	RunAsGroup               *int64 `json:"runAsGroup,omitempty"`
	Privileged               *bool  `json:"privileged,omitempty"`
	Capabilities             *struct {
		Add  []string `json:"add,omitempty"`
		Drop []string `json:"drop,omitempty"`
	} `json:"capabilities,omitempty"`
	SeccompProfile any `json:"seccompProfile,omitempty"`
}

type volumeMount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	SubPath   string `json:"subPath,omitempty"`
}

type volume struct {
	Name      string `json:"name"`
	ConfigMap *struct {
		Name        string `json:"name"`
		Items       any    `json:"items,omitempty"`
		DefaultMode *int   `json:"defaultMode,omitempty"`
		Optional    *bool  `json:"optional,omitempty"`
	} `json:"configMap,omitempty"`
	Secret *struct {
		SecretName  string `json:"secretName"`
		Items       any    `json:"items,omitempty"`
		DefaultMode *int   `json:"defaultMode,omitempty"`
		Optional    *bool  `json:"optional,omitempty"`
	} `json:"secret,omitempty"`
	EmptyDir *struct {
		Medium    string `json:"medium,omitempty"`
		SizeLimit string `json:"sizeLimit,omitempty"`
	} `json:"emptyDir,omitempty"`
	Projected any `json:"projected,omitempty"`
}

type service struct {
	header
	Spec struct {
		Type                  string            `json:"type,omitempty"`
		ClusterIP             string            `json:"clusterIP,omitempty"`
		Selector              map[string]string `json:"selector,omitempty"`
		Ports                 []servicePort     `json:"ports"`
		SessionAffinity       string            `json:"sessionAffinity,omitempty"`
		PublishNotReady       bool              `json:"publishNotReadyAddresses,omitempty"`
		InternalTrafficPolicy string            `json:"internalTrafficPolicy,omitempty"`
	} `json:"spec"`
}

type servicePort struct {
	Name        string `json:"name,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Port        int    `json:"port"`
	TargetPort  any    `json:"targetPort,omitempty"`
	AppProtocol string `json:"appProtocol,omitempty"`
}

type configMap struct {
	header
	Data       map[string]string `json:"data,omitempty"`
	BinaryData map[string]string `json:"binaryData,omitempty"`
	Immutable  *bool             `json:"immutable,omitempty"`
}

type serviceAccount struct {
	header
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
}

type namespace struct {
	header
}

type inferencePool struct {
	header
	Spec struct {
		Selector    labelSelector `json:"selector"`
		TargetPorts []struct {
			Number int `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind,omitempty"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int `json:"number"`
			} `json:"port,omitempty"`
			FailureMode string `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

type ref struct {
	Group       *string `json:"group,omitempty"`
	Kind        string  `json:"kind,omitempty"`
	Name        string  `json:"name"`
	Namespace   string  `json:"namespace,omitempty"`
	SectionName string  `json:"sectionName,omitempty"`
	Port        *int    `json:"port,omitempty"`
	Weight      *int    `json:"weight,omitempty"`
	Filters     any     `json:"filters,omitempty"`
}

type httpRoute struct {
	header
	Spec struct {
		ParentRefs []ref `json:"parentRefs"`
		Hostnames  any   `json:"hostnames,omitempty"`
		Rules      []struct {
			Name        string `json:"name,omitempty"`
			Matches     any    `json:"matches,omitempty"`
			Filters     any    `json:"filters,omitempty"`
			BackendRefs []ref  `json:"backendRefs"`
			Timeouts    *struct {
				Request        string `json:"request,omitempty"`
				BackendRequest string `json:"backendRequest,omitempty"`
			} `json:"timeouts,omitempty"`
		} `json:"rules"`
	} `json:"spec"`
}

type gateway struct {
	header
	Spec struct {
		GatewayClassName string `json:"gatewayClassName"`
		Listeners        []struct {
			Name          string `json:"name"`
			Hostname      string `json:"hostname,omitempty"`
			Port          int    `json:"port"`
			Protocol      string `json:"protocol"`
			TLS           any    `json:"tls,omitempty"`
			AllowedRoutes any    `json:"allowedRoutes,omitempty"`
		} `json:"listeners"`
		Addresses      any `json:"addresses,omitempty"`
		Infrastructure any `json:"infrastructure,omitempty"`
	} `json:"spec"`
}

type gatewayClass struct {
	header
	Spec struct {
		ControllerName string `json:"controllerName"`
		Description    string `json:"description,omitempty"`
		ParametersRef  *ref   `json:"parametersRef,omitempty"`
	} `json:"spec"`
}

// envoyProxy is Envoy Gateway's EnvoyProxy; only the part used here is typed.
type envoyProxy struct {
	header
	Spec struct {
		Provider *struct {
			Type       string `json:"type"`
			Kubernetes *struct {
				EnvoyService    any `json:"envoyService,omitempty"`
				EnvoyDeployment any `json:"envoyDeployment,omitempty"`
				EnvoyHpa        any `json:"envoyHpa,omitempty"`
				EnvoyPDB        any `json:"envoyPDB,omitempty"`
			} `json:"kubernetes,omitempty"`
		} `json:"provider,omitempty"`
		Logging   any `json:"logging,omitempty"`
		Telemetry any `json:"telemetry,omitempty"`
		Shutdown  any `json:"shutdown,omitempty"`
	} `json:"spec"`
}

type podDisruptionBudget struct {
	header
	Spec struct {
		MinAvailable   any           `json:"minAvailable,omitempty"`
		MaxUnavailable any           `json:"maxUnavailable,omitempty"`
		Selector       labelSelector `json:"selector"`
	} `json:"spec"`
}

type role struct {
	header
	Rules []struct {
		APIGroups     []string `json:"apiGroups"`
		Resources     []string `json:"resources"`
		Verbs         []string `json:"verbs"`
		ResourceNames []string `json:"resourceNames,omitempty"`
	} `json:"rules"`
}

type roleBinding struct {
	header
	Subjects []struct {
		Kind      string `json:"kind"`
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"subjects"`
	RoleRef struct {
		APIGroup string `json:"apiGroup"`
		Kind     string `json:"kind"`
		Name     string `json:"name"`
	} `json:"roleRef"`
}

// opaque is a kind whose spec is checked only by the API server's dry run (dryrun_test.go)
// against its CRD: Istio's, GKE's and the Prometheus Operator's.
type opaque struct {
	header
	Spec map[string]any `json:"spec"`
}

// schemas maps apiVersion/kind to a new value of its type. A kind missing here is an error:
// teach this file its fields before using it.
var schemas = map[string]func() any{
	"apps/v1/Deployment":            func() any { return new(deployment) },
	"v1/Service":                    func() any { return new(service) },
	"v1/ConfigMap":                  func() any { return new(configMap) },
	"v1/ServiceAccount":             func() any { return new(serviceAccount) },
	"v1/Namespace":                  func() any { return new(namespace) },
	"policy/v1/PodDisruptionBudget": func() any { return new(podDisruptionBudget) },
	"inference.networking.k8s.io/v1/InferencePool":         func() any { return new(inferencePool) },
	"gateway.networking.k8s.io/v1/HTTPRoute":               func() any { return new(httpRoute) },
	"gateway.networking.k8s.io/v1/Gateway":                 func() any { return new(gateway) },
	"gateway.networking.k8s.io/v1/GatewayClass":            func() any { return new(gatewayClass) },
	"gateway.envoyproxy.io/v1alpha1/EnvoyProxy":            func() any { return new(envoyProxy) },
	"rbac.authorization.k8s.io/v1/Role":                    func() any { return new(role) },
	"rbac.authorization.k8s.io/v1/RoleBinding":             func() any { return new(roleBinding) },
	"networking.istio.io/v1/DestinationRule":               func() any { return new(opaque) },
	"networking.gke.io/v1/HealthCheckPolicy":               func() any { return new(opaque) },
	"networking.gke.io/v1/GCPBackendPolicy":                func() any { return new(opaque) },
	"monitoring.coreos.com/v1/ServiceMonitor":              func() any { return new(opaque) },
	"inference.networking.x-k8s.io/v1alpha2/InferencePool": func() any { return new(opaque) },
}

// clusterScoped kinds have no namespace. kustomize knows the built-in ones; it would give a
// namespace to a custom resource kind such as GatewayClass, hence customClusterScoped.
var (
	clusterScoped       = map[string]bool{"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true, "CustomResourceDefinition": true, "GatewayClass": true}
	customClusterScoped = map[string]bool{"GatewayClass": true}
)
