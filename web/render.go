package web

import (
	"bytes"
	"embed"
	"hash/fnv"
	"html/template"
	"io"
	"strings"
)

//go:embed status.html
var statusHTML string

// assets are the page's stylesheet, script and icon: the page loads
// nothing from any other host.
//
//go:embed assets
var assets embed.FS

// sparkBox and progressBox carry a sparkline or a bar into its template
// with the element id it gets.
type sparkBox struct {
	ID, Label string
	W, H      int
	S         sparkView
}

type progressBox struct {
	ID string
	P  *progressView
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"spark": func(base, key, label string, s sparkView) sparkBox {
		return sparkBox{ID: elementID(base, key), Label: label, W: sparkWidth, H: sparkHeight, S: s}
	},
	"progress": func(base, key string, p *progressView) progressBox {
		return progressBox{ID: elementID(base, key), P: p}
	},
}).Parse(statusHTML))

// renderPage writes the whole page.
func renderPage(w io.Writer, pv pageView) error {
	return pageTemplate.Execute(w, pv)
}

// section is one part of the page the live stream replaces whole: its
// element id, its HTML and a hash of it.
type section struct {
	ID   string
	HTML string
	Hash uint64
}

// volumesID is the element that holds every volume's section; the stream
// replaces it whole when volumes come or go.
const volumesID = "volumes"

// renderSections renders the page's live parts: the time, warnings,
// cluster, topology, each volume and the events. The volume container
// comes last, built from the volumes' parts.
func renderSections(pv pageView) ([]section, error) {
	var out []section
	var buf bytes.Buffer
	render := func(name, id string, data any) error {
		buf.Reset()
		if err := pageTemplate.ExecuteTemplate(&buf, name, data); err != nil {
			return err
		}
		out = append(out, newSection(id, buf.String()))
		return nil
	}
	for _, name := range []string{"asof", "warnings", "cluster", "topology", "events"} {
		if err := render(name, name, pv); err != nil {
			return nil, err
		}
	}
	first := len(out)
	size := 0
	for _, v := range pv.Volumes {
		if err := render("volume", v.ID, v); err != nil {
			return nil, err
		}
		size += len(out[len(out)-1].HTML)
	}
	var all strings.Builder
	all.Grow(size + 64)
	all.WriteString(`<section id="` + volumesID + `">` + "\n")
	for _, s := range out[first:] {
		all.WriteString(s.HTML)
	}
	all.WriteString("\n</section>")
	out = append(out, newSection(volumesID, all.String()))
	return out, nil
}

func newSection(id, html string) section {
	h := fnv.New64a()
	h.Write([]byte(html))
	return section{ID: id, HTML: html, Hash: h.Sum64()}
}
