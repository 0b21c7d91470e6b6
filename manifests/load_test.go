package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// object is one document of a manifest file.
type object struct {
	Source string // file#document
	Raw    map[string]any
}

func (o object) str(key string) string { s, _ := o.Raw[key].(string); return s }
func (o object) Kind() string          { return o.str("kind") }
func (o object) APIVersion() string    { return o.str("apiVersion") }
func (o object) meta() map[string]any  { m, _ := o.Raw["metadata"].(map[string]any); return m }
func (o object) Name() string          { s, _ := o.meta()["name"].(string); return s }
func (o object) Namespace() string     { s, _ := o.meta()["namespace"].(string); return s }
func (o object) schema() string        { return o.APIVersion() + "/" + o.Kind() }
func (o object) String() string {
	return fmt.Sprintf("%s: %s %q", o.Source, o.Kind(), o.Name())
}

// decode decodes the document into v, refusing fields v does not have.
func (o object) decode(v any) error {
	b, err := json.Marshal(o.Raw)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	return nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// parseDocs splits a YAML stream into documents; empty and comment-only documents are skipped.
func parseDocs(source string, b []byte) ([]object, error) {
	var out []object
	for i, doc := range docSeparator.Split(string(b), -1) {
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s#%d: not valid YAML: %w", source, i, err)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(j, &m); err != nil {
			return nil, fmt.Errorf("%s#%d: not a mapping: %w", source, i, err)
		}
		out = append(out, object{Source: fmt.Sprintf("%s#%d", source, i), Raw: m})
	}
	return out, nil
}

func loadFile(path string) ([]object, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseDocs(filepath.ToSlash(filepath.Join("manifests", path)), b)
}

// kustomization is the part of kustomize's Kustomization these manifests use. build applies
// it the way kustomize does; a field it does not model is refused, so that the objects checked
// are the objects kubectl would apply. (patches, generators and name prefixes are left out on
// purpose: a namePrefix would not rewrite the InferencePool's reference to the picker's
// Service, which kustomize does not know about.)
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
	Labels []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	CommonAnnotations map[string]string `json:"commonAnnotations,omitempty"`
}

// build returns the objects `kubectl apply -k dir` would apply.
func build(dir string) ([]object, error) { return buildIn(dir, nil) }

func buildIn(dir string, stack []string) ([]object, error) {
	dir = filepath.Clean(dir)
	for _, d := range stack {
		if d == dir {
			return nil, fmt.Errorf("%s: kustomization cycle %v", dir, append(stack, dir))
		}
	}
	stack = append(stack, dir)
	kpath := filepath.Join(dir, "kustomization.yaml")
	b, err := os.ReadFile(kpath)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kpath, err)
	}
	var k kustomization
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		return nil, fmt.Errorf("%s: %w (validate_test.go models only namespace, resources, images, labels and commonAnnotations)", kpath, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: apiVersion/kind %s/%s, want kustomize.config.k8s.io/v1beta1/Kustomization", kpath, k.APIVersion, k.Kind)
	}
	var objs []object
	listed := map[string]bool{}
	for _, r := range k.Resources {
		if strings.Contains(r, "://") || strings.HasPrefix(r, "github.com/") {
			return nil, fmt.Errorf("%s: remote resource %q: keep the manifests self-contained", kpath, r)
		}
		p := filepath.Join(dir, r)
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: resource %q: %w", kpath, r, err)
		}
		var sub []object
		if fi.IsDir() {
			sub, err = buildIn(p, stack)
		} else {
			listed[filepath.Clean(p)] = true
			sub, err = loadFile(p)
		}
		if err != nil {
			return nil, err
		}
		objs = append(objs, sub...)
	}
	// A YAML file beside the kustomization that it does not list is never applied.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() || e.Name() == "kustomization.yaml" || listed[p] {
			continue
		}
		if ext := filepath.Ext(e.Name()); ext == ".yaml" || ext == ".yml" {
			return nil, fmt.Errorf("%s: %s is not listed in resources, so it is never applied", kpath, e.Name())
		}
	}

	if k.Namespace != "" {
		for _, o := range objs {
			switch {
			case customClusterScoped[o.Kind()]:
				return nil, fmt.Errorf("%s: namespace %q would be set on cluster-scoped %s (kustomize does not know custom kinds are cluster-scoped): keep it out of namespaced kustomizations", kpath, k.Namespace, o)
			case clusterScoped[o.Kind()]:
			case o.Namespace() != "" && o.Namespace() != k.Namespace:
				return nil, fmt.Errorf("%s: namespace %q would move %s out of namespace %q", kpath, k.Namespace, o, o.Namespace())
			default:
				setMeta(o, "namespace", k.Namespace)
			}
		}
	}
	for _, l := range k.Labels {
		if l.IncludeSelectors || l.IncludeTemplates {
			return nil, fmt.Errorf("%s: labels with includeSelectors/includeTemplates are not modelled by validate_test.go", kpath)
		}
		for _, o := range objs {
			for key, v := range l.Pairs {
				setMetaMap(o, "labels", key, v)
			}
		}
	}
	for key, v := range k.CommonAnnotations {
		for _, o := range objs {
			setMetaMap(o, "annotations", key, v)
		}
	}
	for _, img := range k.Images {
		n := 0
		for _, o := range objs {
			for _, c := range podContainers(o) {
				repo, tag, digest := splitImage(c["image"].(string))
				if repo != img.Name {
					continue
				}
				n++
				if img.NewName != "" {
					repo = img.NewName
				}
				if img.NewTag != "" {
					tag = img.NewTag
				}
				if img.Digest != "" {
					tag, digest = "", img.Digest
				}
				c["image"] = joinImage(repo, tag, digest)
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: images: %q matches no container image", kpath, img.Name)
		}
	}
	return objs, nil
}

func setMeta(o object, key string, v any) {
	m := o.meta()
	if m == nil {
		m = map[string]any{}
		o.Raw["metadata"] = m
	}
	m[key] = v
}

func setMetaMap(o object, field, key, v string) {
	m := o.meta()
	if m == nil {
		m = map[string]any{}
		o.Raw["metadata"] = m
	}
	mm, _ := m[field].(map[string]any)
	if mm == nil {
		mm = map[string]any{}
		m[field] = mm
	}
	mm[key] = v
}

// podContainers returns the containers (and init containers) of a workload's pod template.
func podContainers(o object) []map[string]any {
	spec, _ := at(o.Raw, "spec", "template", "spec").(map[string]any)
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := spec[key].([]any)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				if _, ok := m["image"].(string); ok {
					out = append(out, m)
				}
			}
		}
	}
	return out
}

// at walks maps (string keys) and slices (int indexes); nil when the path does not exist.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k < 0 || k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

// splitImage splits "host/repo:tag@digest".
func splitImage(image string) (repo, tag, digest string) {
	repo, digest, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo, tag = repo[:i], repo[i+1:]
	}
	return repo, tag, digest
}

func joinImage(repo, tag, digest string) string {
	s := repo
	if tag != "" {
		s += ":" + tag
	}
	if digest != "" {
		s += "@" + digest
	}
	return s
}

// kustomizations lists every directory under root that holds a kustomization.yaml.
func kustomizations(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	return dirs, err
}
