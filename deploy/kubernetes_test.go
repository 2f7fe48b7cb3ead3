package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/csidriver"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kubernetesObject is an empty object of the Kubernetes API type of apiVersion and kind,
// nil for one the manifests have no business with.
func kubernetesObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "v1 Pod":
		return &corev1.Pod{}
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}
	case "storage.k8s.io/v1 CSIDriver":
		return &storagev1.CSIDriver{}
	case "storage.k8s.io/v1 StorageClass":
		return &storagev1.StorageClass{}
	}
	return nil
}

// documentSeparator splits a YAML file into its documents.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeManifests decodes every document of the YAML files in dir strictly into its
// Kubernetes API type: an unknown field (a typo), a wrong type or an unknown kind is an
// error naming the file and the document.
func decodeManifests(dir string) (objs []any, errs []error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, []error{err}
	}
	if len(files) == 0 {
		return nil, []error{fmt.Errorf("no manifests in %s", dir)}
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i, doc := range documentSeparator.Split(string(raw), -1) {
			if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				errs = append(errs, fmt.Errorf("%s, document %d: %w", f, i+1, err))
				continue
			}
			obj := kubernetesObject(tm.APIVersion, tm.Kind)
			if obj == nil {
				errs = append(errs, fmt.Errorf("%s, document %d: apiVersion %q kind %q is not a type the manifests use", f, i+1, tm.APIVersion, tm.Kind))
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				errs = append(errs, fmt.Errorf("%s, document %d (%s): %w", f, i+1, tm.Kind, err))
				continue
			}
			objs = append(objs, obj)
		}
	}
	return objs, errs
}

// stripComments drops the comment lines of a YAML document.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// TestTheKubernetesManifestsDecodeStrictly decodes every manifest of deploy/kubernetes with
// the Kubernetes API types, refusing unknown fields, and checks that they name replcsi's
// driver as replcsi does: the CSIDriver object, the StorageClass's provisioner and
// parameters, the registrar's socket path, and the sidecars the issue asks for.
func TestTheKubernetesManifestsDecodeStrictly(t *testing.T) {
	objs, errs := decodeManifests("kubernetes")
	for _, err := range errs {
		t.Error(err)
	}
	var (
		drivers   []*storagev1.CSIDriver
		classes   []*storagev1.StorageClass
		sidecars  []string
		privNodes bool
	)
	for _, o := range objs {
		switch o := o.(type) {
		case *storagev1.CSIDriver:
			drivers = append(drivers, o)
		case *storagev1.StorageClass:
			classes = append(classes, o)
		case *appsv1.Deployment:
			for _, c := range o.Spec.Template.Spec.Containers {
				sidecars = append(sidecars, imageName(c.Image))
			}
		case *appsv1.DaemonSet:
			// Its pod's restart ends the host's attachments: no rolling update
			// may restart it.
			if o.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
				t.Errorf("DaemonSet %s updates with %q, want OnDelete: a rolling update would end the attachments of every host", o.Name, o.Spec.UpdateStrategy.Type)
			}
			for _, c := range o.Spec.Template.Spec.Containers {
				sidecars = append(sidecars, imageName(c.Image))
				if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
					privNodes = true
				}
				for _, m := range c.VolumeMounts {
					if m.MountPath == "/var/lib/kubelet" && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional) {
						t.Errorf("DaemonSet %s mounts the kubelet's directory without Bidirectional propagation", o.Name)
					}
				}
				for _, a := range c.Args {
					if p, ok := strings.CutPrefix(a, "--kubelet-registration-path="); ok && !strings.Contains(p, "/"+csidriver.PluginName+"/") {
						t.Errorf("the registrar registers %s, not a path of %s's", p, csidriver.PluginName)
					}
				}
			}
		}
	}
	if len(drivers) != 1 || drivers[0].Name != csidriver.PluginName {
		t.Errorf("the CSIDriver objects are %v; want one named %s (GetPluginInfo's name)", drivers, csidriver.PluginName)
	}
	if len(classes) == 0 {
		t.Error("no StorageClass")
	}
	for _, c := range classes {
		if c.Provisioner != csidriver.PluginName {
			t.Errorf("StorageClass %s has provisioner %q, want %s", c.Name, c.Provisioner, csidriver.PluginName)
		}
		for k := range c.Parameters {
			if !slices.Contains([]string{csidriver.ParamReplicas, csidriver.ParamPool, csidriver.ParamProtocol}, k) && !strings.HasPrefix(k, "csi.storage.k8s.io/") {
				t.Errorf("StorageClass %s has parameter %q, which replcsi refuses", c.Name, k)
			}
		}
	}
	for _, want := range []string{"replvol/replcsi", "registry.k8s.io/sig-storage/csi-provisioner", "registry.k8s.io/sig-storage/csi-resizer", "registry.k8s.io/sig-storage/csi-node-driver-registrar"} {
		if !slices.Contains(sidecars, want) {
			t.Errorf("no container runs %s (the containers run %v)", want, sidecars)
		}
	}
	if !privNodes {
		t.Error("the node plugin does not run privileged: it cannot attach or mount")
	}
}

// imageName is an image reference without its tag.
func imageName(image string) string {
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

// TestAFieldTypoInAManifestFailsTheDecode pins that the decode is strict: a manifest with a
// misspelt field is refused, naming it.
func TestAFieldTypoInAManifestFailsTheDecode(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("kubernetes", "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(raw, []byte("mountPropagation: Bidirectional"), []byte("mountPropogation: Bidirectional"), 1)
	if bytes.Equal(bad, raw) {
		t.Fatal("node.yaml has no mountPropagation to misspell")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs := decodeManifests(dir)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "mountPropogation") {
		t.Fatalf("a misspelt field: the decode said %v; want one error naming it", errs)
	}
}
