package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
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

// build returns the objects `kubectl apply -k dir` would apply, with the kustomize library
// kubectl embeds (sigs.k8s.io/kustomize/api, krusty) run in-process.
func build(dir string) ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	b, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	return parseDocs(filepath.ToSlash(filepath.Join("manifests", dir)), b)
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
