package manifests

import (
	"fmt"
	"maps"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvpick/kvpick/config"
)

// binary describes one of the project's commands as the manifests must run it.
type binary struct {
	main      string             // its package directory, read for flag definitions (see loadWorld)
	flags     map[string]flagDef // filled from main
	portFlags []string           // flags whose value is a port it listens on
	addrFlags []string           // flags whose value is a host:port it listens on
	// grpcProbes: probe field → gRPC health service; the probe must use the port of healthFlag.
	grpcProbes map[string]string
	healthFlag string
	// httpProbes: probe field → path, on the port of addrFlags[0].
	httpProbes map[string]string
	configFlag string // flag naming the configuration file, loaded with config.Parse
	grpcFlag   string // flag of the ext_proc port the InferencePool's picker Service must reach
	poolFlag   string // flag listing ip:port endpoints
	// Kubernetes mode: the flag naming the InferencePool to serve, its API group's flag (and
	// default), the leader-election flag, and the shutdown flags whose sum the pod's grace
	// period must cover (with config/default.yaml's values when a flag is not given).
	poolNameFlag, poolGroupFlag, defaultPoolGroup, leaderFlag string
	drainFlags                                                map[string]string // flag -> config/default.yaml key under shutdown
}

// world is what the manifests are checked against: the binaries' source.
type world struct {
	binaries map[string]*binary // by image name (the repository's last element)
}

// loadWorld reads the flags the binaries define and the gRPC health service names the picker
// registers. The picker's flags come from the built binary's own -h (it registers some from
// tables, pkg/compatflags); the simulator's from its source (no build).
func loadWorld() (*world, error) {
	worldOnce.Do(func() { theWorld, worldErr = readWorld() })
	return theWorld, worldErr
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func readWorld() (*world, error) {
	runner, err := stringConsts("../pkg/runner/runner.go")
	if err != nil {
		return nil, err
	}
	for _, c := range []string{"ServiceLiveness", "ServiceReadiness"} {
		if runner[c] == "" {
			return nil, fmt.Errorf("pkg/runner/runner.go: constant %s not found", c)
		}
	}
	w := &world{binaries: map[string]*binary{
		"kvpick": {
			main:       "../cmd/extproc",
			portFlags:  []string{"grpc-port", "grpc-health-port", "metrics-port"},
			grpcProbes: map[string]string{"livenessProbe": runner["ServiceLiveness"], "readinessProbe": runner["ServiceReadiness"]},
			healthFlag: "grpc-health-port",
			configFlag: "config-file",
			grpcFlag:   "grpc-port",
			poolFlag:   "endpoints",

			poolNameFlag:     "pool-name",
			poolGroupFlag:    "pool-group",
			defaultPoolGroup: "inference.networking.k8s.io",
			leaderFlag:       "ha-enable-leader-election",
			drainFlags:       map[string]string{"drain-timeout": "drainTimeout", "shutdown-delay": "delay"},
		},
		"simserver": {
			main:       "../cmd/simserver",
			addrFlags:  []string{"addr"},
			httpProbes: map[string]string{"livenessProbe": "/health", "readinessProbe": "/health"},
		},
	}}
	if w.binaries["kvpick"].flags, err = pickerFlags(); err != nil {
		return nil, err
	}
	if w.binaries["simserver"].flags, err = binaryFlags(w.binaries["simserver"].main); err != nil {
		return nil, err
	}
	for name, b := range w.binaries {
		need := append(append([]string{}, b.portFlags...), b.addrFlags...)
		need = append(need, b.healthFlag, b.configFlag, b.grpcFlag, b.poolFlag, b.poolNameFlag, b.poolGroupFlag, b.leaderFlag)
		for f := range b.drainFlags {
			need = append(need, f)
		}
		for _, f := range need {
			if _, ok := b.flags[f]; f != "" && !ok {
				return nil, fmt.Errorf("%s: %s no longer defines --%s; update check_test.go's world", b.main, name, f)
			}
		}
	}
	return w, nil
}

type checkOptions struct {
	// poolMembers: every InferencePool must select model server pods defined in the same set.
	poolMembers bool
}

// workload is a Deployment with what its containers listen on.
type workload struct {
	d          *deployment
	src        string
	containers []workloadContainer
}

type workloadContainer struct {
	c      *container
	bin    *binary // nil: not one of the project's images
	values map[string]string
	listen map[int]bool // ports the process listens on, from its flags
}

// port resolves a port by name or number among the pod's container ports.
func (w *workload) port(target any) (int, *workloadContainer, bool) {
	for i := range w.containers {
		wc := &w.containers[i]
		for _, p := range wc.c.Ports {
			switch t := target.(type) {
			case string:
				if p.Name == t {
					return p.ContainerPort, wc, true
				}
			case float64:
				if p.ContainerPort == int(t) {
					return p.ContainerPort, wc, true
				}
			case int:
				if p.ContainerPort == t {
					return p.ContainerPort, wc, true
				}
			}
		}
	}
	return 0, nil, false
}

func (w *workload) selectedBy(sel map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if w.d.Spec.Template.Metadata.Labels[k] != v {
			return false
		}
	}
	return true
}

var (
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	ianaSvcName      = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	envRef           = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
)

// checkSet checks one kustomization's objects; it returns every problem found.
func checkSet(w *world, objs []object, opt checkOptions) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	var (
		workloads []*workload
		services  []*service
		pools     []*inferencePool
		routes    []*httpRoute
		gateways  = map[string]*gateway{}
		cms       = map[string]*configMap{}
		roles     = map[string]*role{}
		bindings  []*roleBinding
		srcs      = map[any]string{}
		seen      = map[string]string{}
	)
	for _, o := range objs {
		if o.APIVersion() == "" || o.Kind() == "" || o.Name() == "" {
			fail("%s: apiVersion, kind and metadata.name are required", o)
			continue
		}
		if len(o.Name()) > 253 || !dns1123Subdomain.MatchString(o.Name()) {
			fail("%s: metadata.name is not a DNS-1123 subdomain", o)
		}
		id := o.Kind() + "/" + o.Namespace() + "/" + o.Name()
		if prev, dup := seen[id]; dup {
			fail("%s: defined twice (also %s)", o, prev)
		}
		seen[id] = o.Source
		mk, ok := schemas[o.schema()]
		if !ok {
			fail("%s: no schema for %s in types_test.go: add the fields the manifest uses", o, o.schema())
			continue
		}
		v := mk()
		if err := o.decode(v); err != nil {
			fail("%v", err)
			continue
		}
		srcs[v] = o.String()
		switch v := v.(type) {
		case *deployment:
			workloads = append(workloads, &workload{d: v, src: o.String()})
		case *service:
			services = append(services, v)
		case *inferencePool:
			pools = append(pools, v)
		case *httpRoute:
			routes = append(routes, v)
		case *gateway:
			gateways[v.Metadata.Name] = v
		case *configMap:
			cms[v.Metadata.Name] = v
		case *role:
			roles[v.Metadata.Name] = v
		case *roleBinding:
			bindings = append(bindings, v)
		}
	}

	for _, wl := range workloads {
		errs = append(errs, checkWorkload(w, wl, cms)...)
		errs = append(errs, checkKubernetesMode(wl, pools, roles, bindings)...)
	}
	for _, s := range services {
		errs = append(errs, checkService(srcs[s], s, workloads)...)
	}
	for _, p := range pools {
		errs = append(errs, checkPool(srcs[p], p, services, workloads, opt)...)
	}
	poolNames := map[string]bool{}
	for _, p := range pools {
		poolNames[p.Metadata.Name] = true
	}
	for _, r := range routes {
		src := srcs[r]
		if len(r.Spec.ParentRefs) == 0 {
			fail("%s: no parentRefs", src)
		}
		for _, pr := range r.Spec.ParentRefs {
			if (pr.Kind == "" || pr.Kind == "Gateway") && len(gateways) > 0 && gateways[pr.Name] == nil {
				fail("%s: parentRef Gateway %q is not in this set", src, pr.Name)
			}
		}
		for i, rule := range r.Spec.Rules {
			if rule.Timeouts != nil {
				for _, d := range []string{rule.Timeouts.Request, rule.Timeouts.BackendRequest} {
					if _, err := time.ParseDuration(d); d != "" && err != nil {
						fail("%s: rules[%d].timeouts %q: %v", src, i, d, err)
					}
				}
			}
			for _, br := range rule.BackendRefs {
				if br.Kind != "InferencePool" {
					continue
				}
				if br.Group == nil || *br.Group != "inference.networking.k8s.io" {
					fail("%s: backendRef InferencePool %q needs group inference.networking.k8s.io", src, br.Name)
				}
				if br.Namespace != "" && br.Namespace != r.Metadata.Namespace {
					fail("%s: backendRef InferencePool %q in another namespace", src, br.Name)
				}
				if !poolNames[br.Name] {
					fail("%s: backendRef InferencePool %q is not in this set", src, br.Name)
				}
			}
		}
	}
	for _, g := range gateways {
		if g.Spec.GatewayClassName == "" || len(g.Spec.Listeners) == 0 {
			fail("%s: gatewayClassName and listeners are required", srcs[g])
		}
	}
	return errs
}

func checkWorkload(w *world, wl *workload, cms map[string]*configMap) []error {
	var errs []error
	d := wl.d
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{wl.src}, a...)...))
	}
	sel := d.Spec.Selector.MatchLabels
	if len(sel) == 0 {
		fail("spec.selector.matchLabels is empty")
	}
	for k, v := range sel {
		if d.Spec.Template.Metadata.Labels[k] != v {
			fail("selector %s=%s does not match the pod template's labels", k, v)
		}
	}
	pod := d.Spec.Template.Spec
	podNonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
	volumes := map[string]*volume{}
	for i := range pod.Volumes {
		volumes[pod.Volumes[i].Name] = &pod.Volumes[i]
	}
	if len(pod.Containers) == 0 {
		fail("no containers")
	}
	for i := range pod.Containers {
		c := &pod.Containers[i]
		cname := fmt.Sprintf("container %q", c.Name)
		if !dns1123Label.MatchString(c.Name) {
			fail("%s: name is not a DNS-1123 label", cname)
		}
		if c.Image == "" {
			fail("%s: no image", cname)
		}
		sc := c.SecurityContext
		if !podNonRoot && (sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
			fail("%s: runAsNonRoot is not set (pod or container securityContext)", cname)
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			fail("%s: securityContext.readOnlyRootFilesystem must be true", cname)
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			fail("%s: securityContext.allowPrivilegeEscalation must be false", cname)
		}
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			fail("%s: securityContext.capabilities.drop must include ALL", cname)
		}
		if c.Resources == nil || c.Resources.Requests["cpu"] == nil || c.Resources.Requests["memory"] == nil || c.Resources.Limits["memory"] == nil {
			fail("%s: resources need requests.cpu, requests.memory and limits.memory", cname)
		}
		portNames, portNums := map[string]bool{}, map[int]bool{}
		for _, p := range c.Ports {
			if p.ContainerPort < 1 || p.ContainerPort > 65535 || portNums[p.ContainerPort] {
				fail("%s: containerPort %d invalid or repeated", cname, p.ContainerPort)
			}
			portNums[p.ContainerPort] = true
			if p.Name != "" && (len(p.Name) > 15 || !ianaSvcName.MatchString(p.Name) || portNames[p.Name]) {
				fail("%s: port name %q invalid (IANA service name, at most 15 characters) or repeated", cname, p.Name)
			}
			portNames[p.Name] = true
		}
		mounts := map[string]*volume{}
		for _, m := range c.VolumeMounts {
			v := volumes[m.Name]
			if v == nil {
				fail("%s: volumeMount %q names no volume", cname, m.Name)
				continue
			}
			mounts[path.Clean(m.MountPath)] = v
			if v.ConfigMap != nil && len(cms) > 0 && cms[v.ConfigMap.Name] == nil {
				fail("%s: volume %q mounts ConfigMap %q, which is not in this set", cname, m.Name, v.ConfigMap.Name)
			}
		}
		env := map[string]*envVar{}
		for j := range c.Env {
			env[c.Env[j].Name] = &c.Env[j]
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, m := range envRef.FindAllStringSubmatch(a, -1) {
				if env[m[1]] == nil {
					fail("%s: %q refers to $(%s), which is not in env: Kubernetes would pass it literally", cname, a, m[1])
				}
			}
		}

		wc := workloadContainer{c: c, listen: map[int]bool{}}
		repo, _, _ := splitImage(c.Image)
		base := path.Base(repo)
		wc.bin = w.binaries[base]
		if wc.bin == nil {
			if strings.Contains(repo, "kvpick") {
				fail("%s: image %q looks like a kvpick image but names no known command (%v)", cname, c.Image, slices.Sorted(maps.Keys(w.binaries)))
			}
			wl.containers = append(wl.containers, wc)
			continue
		}
		b := wc.bin
		if len(c.Command) > 0 {
			fail("%s: command overrides the image's entrypoint; pass flags in args", cname)
		}
		values, argErrs := parseArgs(c.Args, b.flags, env)
		for _, e := range argErrs {
			fail("%s: %v", cname, e)
		}
		wc.values = values
		value := func(f string) string {
			if v, ok := values[f]; ok {
				return v
			}
			return b.flags[f].Default
		}
		for _, f := range b.portFlags {
			if n, err := strconv.Atoi(value(f)); err == nil {
				wc.listen[n] = true
			}
		}
		for _, f := range b.addrFlags {
			if _, p, err := net.SplitHostPort(value(f)); err == nil {
				if n, err := strconv.Atoi(p); err == nil {
					wc.listen[n] = true
				}
			}
		}
		for n := range wc.listen {
			if !portNums[n] {
				fail("%s: %s listens on %d (its flags say so) but ports does not declare it", cname, base, n)
			}
		}
		for n := range portNums {
			if !wc.listen[n] {
				fail("%s: declares containerPort %d, on which %s does not listen", cname, n, base)
			}
		}
		probes := map[string]*probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe}
		for field, svc := range b.grpcProbes {
			p := probes[field]
			want, _ := strconv.Atoi(value(b.healthFlag))
			switch {
			case p == nil || p.GRPC == nil:
				fail("%s: %s must be a gRPC probe of service %q on port %d (--%s)", cname, field, svc, want, b.healthFlag)
			case p.GRPC.Service == nil || *p.GRPC.Service != svc:
				got := "<none>"
				if p.GRPC.Service != nil {
					got = *p.GRPC.Service
				}
				fail("%s: %s: gRPC service %q, want %q (what %s registers)", cname, field, got, svc, base)
			case p.GRPC.Port != want:
				fail("%s: %s: gRPC port %d, want %d (--%s)", cname, field, p.GRPC.Port, want, b.healthFlag)
			}
		}
		for field, hp := range b.httpProbes {
			p := probes[field]
			if p == nil || p.HTTPGet == nil {
				fail("%s: %s must be an httpGet probe of %s", cname, field, hp)
				continue
			}
			if p.HTTPGet.Path != hp {
				fail("%s: %s: path %q, want %q", cname, field, p.HTTPGet.Path, hp)
			}
			n, _, ok := (&workload{containers: []workloadContainer{wc}}).port(p.HTTPGet.Port)
			if !ok || !wc.listen[n] {
				fail("%s: %s: port %v is not a port %s listens on", cname, field, p.HTTPGet.Port, base)
			}
		}
		if b.configFlag != "" {
			if file := values[b.configFlag]; file != "" {
				v := mounts[path.Dir(file)]
				switch {
				case v == nil || v.ConfigMap == nil:
					fail("%s: --%s=%s: no ConfigMap volume is mounted at %s", cname, b.configFlag, file, path.Dir(file))
				case cms[v.ConfigMap.Name] == nil:
					fail("%s: --%s=%s: ConfigMap %q is not in this set", cname, b.configFlag, file, v.ConfigMap.Name)
				default:
					text, ok := cms[v.ConfigMap.Name].Data[path.Base(file)]
					if !ok {
						fail("%s: --%s=%s: ConfigMap %q has no key %q", cname, b.configFlag, file, v.ConfigMap.Name, path.Base(file))
					} else if _, err := config.Parse([]byte(text)); err != nil {
						fail("%s: --%s=%s (ConfigMap %q): config.Parse: %v", cname, b.configFlag, file, v.ConfigMap.Name, err)
					}
				}
			}
		}
		if b.poolFlag != "" {
			if list := values[b.poolFlag]; list != "" && !envRef.MatchString(list) {
				for _, ep := range strings.Split(list, ",") {
					if h, p, err := net.SplitHostPort(ep); err != nil || net.ParseIP(h) == nil || p == "" {
						fail("%s: --%s: %q is not ip:port", cname, b.poolFlag, ep)
					}
				}
			}
		}
		wl.containers = append(wl.containers, wc)
	}
	return errs
}

// parseArgs parses container args as Go's flag package would, against the flags the binary
// defines; $(VAR) references are replaced by literal env values before values are checked.
func parseArgs(args []string, defs map[string]flagDef, env map[string]*envVar) (map[string]string, []error) {
	values := map[string]string{}
	var errs []error
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" || strings.HasPrefix(a, "---") {
			errs = append(errs, fmt.Errorf("argument %q: not a flag (the commands take no positional arguments)", a))
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		d, ok := defs[name]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown flag %q: the command defines %v", "--"+name, slices.Sorted(maps.Keys(defs))))
			continue
		}
		if !hasVal {
			if d.Type == "bool" {
				val = "true"
			} else if i+1 < len(args) {
				i++
				val = args[i]
			} else {
				errs = append(errs, fmt.Errorf("flag --%s needs a value", name))
				continue
			}
		}
		if _, dup := values[name]; dup {
			errs = append(errs, fmt.Errorf("flag --%s is given twice", name))
		}
		values[name] = val
		resolved, known := val, true
		resolved = envRef.ReplaceAllStringFunc(val, func(ref string) string {
			e := env[ref[2:len(ref)-1]]
			if e == nil || e.ValueFrom != nil {
				known = false
				return ""
			}
			return e.Value
		})
		if !known {
			continue
		}
		var err error
		switch d.Type {
		case "bool":
			_, err = strconv.ParseBool(resolved)
		case "int":
			_, err = strconv.ParseInt(resolved, 0, 64)
		case "uint":
			_, err = strconv.ParseUint(resolved, 0, 64)
		case "float":
			_, err = strconv.ParseFloat(resolved, 64)
		case "duration":
			_, err = time.ParseDuration(resolved)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("flag --%s: invalid %s value %q", name, d.Type, resolved))
		}
	}
	return values, errs
}

func checkService(src string, s *service, workloads []*workload) []error {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{src}, a...)...))
	}
	var selected []*workload
	for _, wl := range workloads {
		if wl.selectedBy(s.Spec.Selector) {
			selected = append(selected, wl)
		}
	}
	if len(s.Spec.Selector) == 0 || len(selected) == 0 {
		fail("selector %v selects no pod template in this set", s.Spec.Selector)
	}
	names := map[string]bool{}
	for _, p := range s.Spec.Ports {
		if p.Port < 1 || p.Port > 65535 {
			fail("port %d out of range", p.Port)
		}
		if len(s.Spec.Ports) > 1 && p.Name == "" || p.Name != "" && (len(p.Name) > 15 || !dns1123Label.MatchString(p.Name)) || names[p.Name] {
			fail("port name %q missing, invalid or repeated", p.Name)
		}
		names[p.Name] = true
		target := p.TargetPort
		if target == nil {
			target = p.Port
		}
		for _, wl := range selected {
			n, wc, ok := wl.port(target)
			if !ok {
				fail("port %d: targetPort %v is not a container port of %s", p.Port, target, wl.src)
				continue
			}
			if wc.bin != nil && wc.bin.grpcFlag != "" && strconv.Itoa(n) == wc.valueOr(wc.bin.grpcFlag) && p.AppProtocol != "http2" {
				fail("port %d reaches the ext_proc gRPC port: appProtocol must be http2, not %q", p.Port, p.AppProtocol)
			}
		}
	}
	return errs
}

func (wc *workloadContainer) valueOr(flag string) string {
	if v, ok := wc.values[flag]; ok {
		return v
	}
	return wc.bin.flags[flag].Default
}

func checkPool(src string, p *inferencePool, services []*service, workloads []*workload, opt checkOptions) []error {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{src}, a...)...))
	}
	ref := p.Spec.EndpointPickerRef
	if ref.Group != nil && *ref.Group != "" || ref.Kind != "" && ref.Kind != "Service" {
		fail("endpointPickerRef must name a core Service")
	}
	switch ref.FailureMode {
	case "", "FailOpen", "FailClose":
	default:
		fail("endpointPickerRef.failureMode %q: want FailOpen or FailClose", ref.FailureMode)
	}
	if ref.Port == nil {
		fail("endpointPickerRef.port is required for a Service")
	}
	var svc *service
	for _, s := range services {
		if s.Metadata.Name == ref.Name {
			svc = s
		}
	}
	if svc == nil {
		fail("endpointPickerRef names Service %q, which is not in this set", ref.Name)
	} else if ref.Port != nil {
		var sp *servicePort
		for i := range svc.Spec.Ports {
			if svc.Spec.Ports[i].Port == ref.Port.Number {
				sp = &svc.Spec.Ports[i]
			}
		}
		if sp == nil {
			fail("endpointPickerRef.port %d: Service %q has no port %d", ref.Port.Number, ref.Name, ref.Port.Number)
		} else {
			target := sp.TargetPort
			if target == nil {
				target = sp.Port
			}
			reached := false
			for _, wl := range workloads {
				if !wl.selectedBy(svc.Spec.Selector) {
					continue
				}
				if n, wc, ok := wl.port(target); ok && wc.bin != nil && wc.bin.grpcFlag != "" && strconv.Itoa(n) == wc.valueOr(wc.bin.grpcFlag) {
					reached = true
				}
			}
			if !reached {
				fail("endpointPickerRef.port %d: Service %q port %d does not reach a picker's ext_proc port (--grpc-port)", ref.Port.Number, ref.Name, ref.Port.Number)
			}
		}
	}
	if n := len(p.Spec.TargetPorts); n < 1 || n > 8 {
		fail("targetPorts: %d entries, want 1..8", n)
	}
	sel := p.Spec.Selector.MatchLabels
	if len(sel) == 0 {
		fail("selector.matchLabels is empty")
	}
	members := 0
	for _, wl := range workloads {
		if !wl.selectedBy(sel) {
			continue
		}
		members++
		for _, wc := range wl.containers {
			if wc.bin != nil && wc.bin.grpcFlag != "" {
				fail("selector %v selects the picker itself (%s)", sel, wl.src)
			}
		}
		for _, tp := range p.Spec.TargetPorts {
			if _, _, ok := wl.port(tp.Number); !ok {
				fail("targetPorts %d is not a container port of member %s", tp.Number, wl.src)
			}
		}
	}
	if opt.poolMembers && members == 0 {
		fail("selector %v selects no model server pod template in this set", sel)
	}
	return errs
}

// checkKubernetesMode checks a picker that serves an InferencePool (--pool-name): no static
// pool beside it, the pool in the set when the set has pools, a grace period that covers its
// shutdown, and a service account allowed to read the pool and its pods (and to hold a Lease
// with leader election), through a RoleBinding of this set.
func checkKubernetesMode(wl *workload, pools []*inferencePool, roles map[string]*role, bindings []*roleBinding) []error {
	var errs []error
	fail := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{wl.src}, a...)...))
	}
	for _, wc := range wl.containers {
		b := wc.bin
		if b == nil || b.poolNameFlag == "" {
			continue
		}
		pool := wc.values[b.poolNameFlag]
		if pool == "" {
			continue
		}
		if eps := wc.values[b.poolFlag]; eps != "" {
			fail("--%s and --%s are exclusive: the pool comes from the InferencePool", b.poolNameFlag, b.poolFlag)
		}
		group := wc.valueOr(b.poolGroupFlag)
		if group == "" {
			group = b.defaultPoolGroup
		}
		if len(pools) > 0 && !slices.ContainsFunc(pools, func(p *inferencePool) bool { return p.Metadata.Name == pool }) {
			fail("--%s=%s names no InferencePool in this set", b.poolNameFlag, pool)
		}
		var need time.Duration
		for flag, key := range b.drainFlags {
			v, ok := wc.values[flag]
			if !ok {
				v = defaultShutdown(key)
			}
			d, err := time.ParseDuration(v)
			if err != nil {
				fail("--%s=%q: not a duration", flag, v)
			}
			need += d
		}
		if g := wl.d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < need {
			fail("terminationGracePeriodSeconds %v is shorter than the picker's shutdown delay + drain timeout (%v): Kubernetes would kill it mid-drain", g, need)
		}
		pod := wl.d.Spec.Template.Spec
		if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
			fail("automountServiceAccountToken is false: the picker needs its token to watch the InferencePool")
		}
		sa := pod.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		want := map[string][]string{"/pods": {"get", "list", "watch"}, group + "/inferencepools": {"get", "list", "watch"}}
		if leader, _ := strconv.ParseBool(wc.valueOr(b.leaderFlag)); leader {
			want["coordination.k8s.io/leases"] = []string{"create", "get", "update"}
		}
		granted := map[string][]string{}
		for _, rb := range bindings {
			bound := slices.ContainsFunc(rb.Subjects, func(s struct {
				Kind      string `json:"kind"`
				Name      string `json:"name"`
				Namespace string `json:"namespace,omitempty"`
			}) bool {
				return s.Kind == "ServiceAccount" && s.Name == sa && (s.Namespace == "" || s.Namespace == wl.d.Metadata.Namespace)
			})
			r := roles[rb.RoleRef.Name]
			if !bound || rb.RoleRef.Kind != "Role" || r == nil {
				continue
			}
			for _, rule := range r.Rules {
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						granted[g+"/"+res] = append(granted[g+"/"+res], rule.Verbs...)
					}
				}
			}
		}
		for res, verbs := range want {
			for _, v := range verbs {
				if !slices.Contains(granted[res], v) && !slices.Contains(granted[res], "*") {
					fail("service account %q may not %s %s (no RoleBinding in this set grants it)", sa, v, res)
				}
			}
		}
	}
	return errs
}

// defaultShutdown is config/default.yaml's shutdown.<key>.
func defaultShutdown(key string) string {
	docs, err := parseDocs("config/default.yaml", config.DefaultYAML())
	if err != nil || len(docs) != 1 {
		return ""
	}
	v, _ := at(docs[0].Raw, "shutdown", key).(string)
	return v
}
