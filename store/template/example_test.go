package template_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/store/template"
)

// Example shows the calls the supervisor makes: capture a stopped sandbox's layer, clone it
// (lease, then binding, under the store's lock), remove the clone (binding, then release),
// and retire the generation.
func Example() {
	root, _ := os.MkdirTemp("", "bothyd-example")
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ts, err := template.Open(root, template.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ts.Close()
	key := template.Key{Runtime: "namespace/v1", Image: "host", Resources: template.Resources{VCPUs: 1, MemoryMB: 512, Pids: 256}}

	// Capture: the layer of a stopped sandbox (here, a directory with one file).
	upper := filepath.Join(root, "sandboxes", "builder", "upper")
	os.MkdirAll(upper, 0o700)
	os.WriteFile(filepath.Join(upper, "installed"), []byte("yes"), 0o644)
	ts.CreateTemplate(ctx, "python-base")
	g, err := ts.Capture(ctx, "python-base", upper, key, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("captured", g.ID, g.State, g.Eligibility)

	// Clone into sandbox "py-1" (whose state directory the sandbox store made; the caller
	// also holds its lifecycle lock between Lock and Unlock).
	dir := filepath.Join(root, "sandboxes", "py-1")
	os.MkdirAll(dir, 0o700)
	tx, err := ts.Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	now, _ := ts.Now()
	sel, err := tx.Select("python-base", key, now)
	if err == nil {
		err = template.CheckUnbound(dir, "py-1")
	}
	var lease *template.Lease
	if err == nil {
		lease, err = tx.WriteLease("python-base", sel.ID, "py-1")
	}
	if err == nil {
		err = template.WriteBinding(dir, template.NewBinding(lease))
	}
	tx.Unlock()
	if err != nil {
		fmt.Println(err)
		return
	}
	lower, _ := ts.PayloadDir("python-base", sel.ID)
	fmt.Println("clone lower layer:", filepath.Base(filepath.Dir(lower))+"/"+filepath.Base(lower))

	// A leased generation cannot be retired.
	exists := template.BindingChecker(func(id string) (string, error) { return filepath.Join(root, "sandboxes", id), nil })
	_, err = ts.Retire(ctx, "python-base", g.ID, false, exists)
	fmt.Println("retire while leased:", err != nil)

	// Removing the clone: binding first, then the lease.
	b, _ := template.ReadBinding(dir)
	template.RemoveBinding(dir)
	ts.Release(ctx, b.Template, b.Generation, b.Lease)

	out, err := ts.Retire(ctx, "python-base", g.ID, false, exists)
	fmt.Println("retire:", out, err)
	// Output:
	// captured g000001 active eligible
	// clone lower layer: g000001/payload
	// retire while leased: true
	// retire: retired <nil>
}
