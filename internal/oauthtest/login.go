package oauthtest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"

	"github.com/zitadel/oidc/v3/pkg/op"
)

var loginTemplate = template.Must(template.New("login").Parse(`<!DOCTYPE html>
<html><head><title>Sign in</title></head><body>
<form method="post" action="{{.Action}}">
<input type="hidden" name="id" value="{{.ID}}"/>
<label>Username <input type="text" name="username" value=""/></label>
<label>Password <input type="password" name="password" value=""/></label>
{{if .Error}}<p class="error">{{.Error}}</p>{{end}}
<button type="submit">Sign in</button>
</form>
</body></html>
`))

func (s *Server) renderLogin(w http.ResponseWriter, id, msg string, status int) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	loginTemplate.Execute(w, struct{ Action, ID, Error string }{s.URL("/login"), id, msg})
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.renderLogin(w, r.URL.Query().Get("authRequestID"), "", http.StatusOK)
}

func (s *Server) loginSubmit(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "cannot parse form: "+err.Error(), http.StatusBadRequest)
		return
	}
	id := r.PostFormValue("id")
	if err := s.st.login(r.PostFormValue("username"), r.PostFormValue("password"), id); err != nil {
		s.renderLogin(w, id, err.Error(), http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, op.AuthCallbackURL(s.prov)(r.Context(), id), http.StatusFound)
}

// A Browser signs a user in at the server as a person's browser would: it
// follows the authorization request's redirects to the login page, fills in
// and posts the form, and follows redirects until one leaves the server (the
// client's redirect_uri), which it returns without fetching.
type Browser struct {
	// Client is the browser's HTTP client; nil means a new one with a
	// cookie jar.
	Client *http.Client
}

// ErrLoginRefused is returned when the login page answers the posted form
// with an error (a wrong password).
var ErrLoginRefused = errors.New("login refused")

// SignIn opens authURL and signs in as username/password. It returns the
// URL the server redirected to outside itself: the redirect_uri with code
// and state (or error) parameters.
func (b *Browser) SignIn(ctx context.Context, authURL, username, password string) (*url.URL, error) {
	c := b.Client
	if c == nil {
		jar, _ := cookiejar.New(nil)
		c = &http.Client{Jar: jar}
	}
	start, err := url.Parse(authURL)
	if err != nil {
		return nil, fmt.Errorf("authorization URL: %w", err)
	}
	origin := start.Scheme + "://" + start.Host
	client := *c
	var left *url.URL
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme+"://"+req.URL.Host != origin {
			left = req.URL
			return http.ErrUseLastResponse
		}
		if len(via) > 10 {
			return errors.New("more than 10 redirects")
		}
		return nil
	}
	get, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return nil, err
	}
	page, err := fetch(&client, get)
	if left != nil {
		return left, nil // already signed in, or an error sent to the client
	}
	if err != nil {
		return nil, err
	}
	form, err := parseForm(page.body)
	if err != nil {
		return nil, fmt.Errorf("login page %s: %w", page.url, err)
	}
	form.values.Set("username", username)
	form.values.Set("password", password)
	action, err := page.url.Parse(form.action)
	if err != nil {
		return nil, fmt.Errorf("login form action: %w", err)
	}
	post, err := http.NewRequestWithContext(ctx, http.MethodPost, action.String(), strings.NewReader(form.values.Encode()))
	if err != nil {
		return nil, err
	}
	post.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := fetch(&client, post)
	if left != nil {
		return left, nil
	}
	if err != nil {
		return nil, err
	}
	if res.status == http.StatusUnauthorized {
		return nil, fmt.Errorf("%w: %s", ErrLoginRefused, strings.TrimSpace(res.errorText()))
	}
	return nil, fmt.Errorf("sign-in ended at %s (status %d) without redirecting to the client", res.url, res.status)
}

type page struct {
	url    *url.URL
	status int
	body   []byte
}

func (p *page) errorText() string {
	i := strings.Index(string(p.body), `class="error">`)
	if i < 0 {
		return ""
	}
	rest := string(p.body[i+len(`class="error">`):])
	if j := strings.Index(rest, "<"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func fetch(c *http.Client, req *http.Request) (*page, error) {
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 300 && res.StatusCode < 400 {
		return nil, fmt.Errorf("%s: redirect %d without a usable location", res.Request.URL, res.StatusCode)
	}
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusUnauthorized {
		return nil, fmt.Errorf("%s: status %d: %s", res.Request.URL, res.StatusCode, strings.TrimSpace(string(body)))
	}
	return &page{url: res.Request.URL, status: res.StatusCode, body: body}, nil
}

type htmlForm struct {
	action string
	values url.Values
}

// parseForm reads the first form of an HTML page: its action and the names
// and values of its inputs.
func parseForm(body []byte) (*htmlForm, error) {
	d := xml.NewDecoder(strings.NewReader(string(body)))
	d.Strict = false
	d.AutoClose = xml.HTMLAutoClose
	d.Entity = xml.HTMLEntity
	var f *htmlForm
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parse HTML: %w", err)
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := func(name string) string {
			for _, a := range el.Attr {
				if strings.EqualFold(a.Name.Local, name) {
					return a.Value
				}
			}
			return ""
		}
		switch strings.ToLower(el.Name.Local) {
		case "form":
			if f != nil {
				return f, nil
			}
			f = &htmlForm{action: attr("action"), values: url.Values{}}
		case "input":
			if f != nil && attr("name") != "" {
				f.values.Set(attr("name"), attr("value"))
			}
		}
	}
	if f == nil {
		return nil, errors.New("no form on the page")
	}
	return f, nil
}
