// Command orders is an order service behind dlq-sidecar, Go standard library only.
//
// The sidecar POSTs each Kafka record to /records: the body is the record value, metadata comes
// in Kafka-* headers. This app decides by the order's "kind":
//
//	ok      accept
//	poison  reject with error class OrderValidationError (the sidecar writes it to the DLQ)
//	flaky   release with retry_after_ms 100 while Kafka-Delivery-Count <= fails (default 2),
//	        then accept; an order whose "fails" reaches the sidecar's delivery limit is archived
//	slow    answer 202 now, accept later through the sidecar's POST /v1/acks (SIDECAR_API)
//
//	go run . [-host 127.0.0.1] [-port 8080] [-unix PATH] [-quiet]
//
// SIDECAR_API is http://host:port (default http://127.0.0.1:8787) or unix:/path/to/api.sock.
// Each decision is logged as one line: order=<id> kind=<kind> delivery=<n> answer=<ack>.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	slowAckDelay = 200 * time.Millisecond
	retryAfterMs = 100
)

// Order is the record value the demo produces.
type Order struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Fails *int   `json:"fails,omitempty"`
}

// AppError is the "error" object of an answer; the sidecar copies it into __dlq.errors.* headers.
type AppError struct {
	Class      string `json:"class"`
	Message    string `json:"message"`
	Stacktrace string `json:"stacktrace,omitempty"`
}

// Answer is the JSON body that tells the sidecar what to do with the record.
type Answer struct {
	Ack          string    `json:"ack"`
	Error        *AppError `json:"error,omitempty"`
	RetryAfterMs int       `json:"retry_after_ms,omitempty"`
}

// OrderValidationError is what a bad order fails with; its name becomes the DLQ error class.
type OrderValidationError struct{ msg string }

func (e *OrderValidationError) Error() string { return e.msg }

var (
	quiet      bool
	sidecarAPI = strings.TrimRight(envOr("SIDECAR_API", "http://127.0.0.1:8787"), "/")
	ackClient  = newAckClient(sidecarAPI)
	logger     = log.New(os.Stdout, "", 0)
)

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func logf(format string, args ...any) {
	if !quiet {
		logger.Printf(format, args...)
	}
}

// newAckClient reaches the sidecar's API over TCP, or over a Unix socket for unix:/path.
func newAckClient(api string) *http.Client {
	transport := &http.Transport{MaxIdleConnsPerHost: 16}
	if path, ok := strings.CutPrefix(api, "unix:"); ok {
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}
	}
	return &http.Client{Transport: transport, Timeout: 5 * time.Second}
}

func ackURL() string {
	if strings.HasPrefix(sidecarAPI, "unix:") {
		return "http://sidecar/v1/acks" // the host is ignored: the transport dials the socket
	}
	return sidecarAPI + "/v1/acks"
}

// ackLater answers a deferred delivery through the sidecar's local API. If it fails, the record
// is not lost: the sidecar redelivers it when its lock expires.
func ackLater(deliveryID, orderID string) {
	body, _ := json.Marshal(map[string]any{"acks": []map[string]string{{"id": deliveryID, "ack": "accept"}}})
	resp, err := ackClient.Post(ackURL(), "application/json", bytes.NewReader(body))
	if err != nil {
		logf("order=%s acked=accept error=%v", orderID, err)
		return
	}
	defer resp.Body.Close()
	var out struct {
		Results []struct {
			Result string `json:"result"`
		} `json:"results"`
	}
	result := "status " + strconv.Itoa(resp.StatusCode)
	if json.NewDecoder(resp.Body).Decode(&out) == nil && len(out.Results) == 1 {
		result = out.Results[0].Result
	}
	logf("order=%s acked=accept result=%s", orderID, result)
}

func validate(o Order) *OrderValidationError {
	// A real service would check the order here; a "poison" order always fails.
	if o.Kind == "poison" {
		return &OrderValidationError{fmt.Sprintf("order %s: quantity must be positive", o.ID)}
	}
	return nil
}

// decide returns the status and the JSON answer (nil: no body) for one order.
func decide(o Order, delivery int, deliveryID string) (int, *Answer) {
	switch o.Kind {
	case "flaky":
		fails := 2
		if o.Fails != nil {
			fails = *o.Fails
		}
		if delivery <= fails {
			return http.StatusOK, &Answer{
				Ack:          "release",
				RetryAfterMs: retryAfterMs,
				Error: &AppError{
					Class:   "InventoryUnavailable",
					Message: fmt.Sprintf("inventory service timed out (delivery %d)", delivery),
				},
			}
		}
		return http.StatusOK, &Answer{Ack: "accept"}
	case "slow":
		time.AfterFunc(slowAckDelay, func() { ackLater(deliveryID, o.ID) })
		return http.StatusAccepted, nil
	}
	if err := validate(o); err != nil {
		return http.StatusOK, &Answer{Ack: "reject", Error: &AppError{
			Class: "OrderValidationError", Message: err.Error(), Stacktrace: string(debug.Stack()),
		}}
	}
	return http.StatusOK, &Answer{Ack: "accept"}
}

func reply(w http.ResponseWriter, status int, answer any) {
	var data []byte
	if answer != nil {
		data, _ = json.Marshal(answer)
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func records(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		reply(w, http.StatusMethodNotAllowed, map[string]string{"error": "POST only"})
		return
	}
	delivery, err := strconv.Atoi(r.Header.Get("Kafka-Delivery-Count"))
	if err != nil {
		delivery = 1
	}
	deliveryID := r.Header.Get("Kafka-Delivery-Id")
	body, err := io.ReadAll(r.Body)
	var o Order
	if err == nil {
		err = json.Unmarshal(body, &o)
	}
	if err != nil {
		logf("order=? kind=? delivery=%d answer=reject", delivery)
		reply(w, http.StatusOK, &Answer{Ack: "reject", Error: &AppError{Class: "OrderParseError", Message: err.Error()}})
		return
	}
	status, answer := decide(o, delivery, deliveryID)
	word := "deferred"
	if answer != nil {
		word = answer.Ack
	}
	logf("order=%s kind=%s delivery=%d answer=%s", o.ID, o.Kind, delivery, word)
	if answer == nil {
		reply(w, status, nil) // a nil *Answer inside an `any` would not be nil
		return
	}
	reply(w, status, answer)
}

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 8080, "TCP port to listen on (0 picks a free one)")
	unix := flag.String("unix", "", "listen on this Unix socket instead of TCP")
	flag.BoolVar(&quiet, "quiet", false, "do not log each decision")
	flag.Parse()

	var ln net.Listener
	var err error
	where := ""
	if *unix != "" {
		_ = os.Remove(*unix) // a socket left behind by an earlier run
		ln, err = net.Listen("unix", *unix)
		where = "unix:" + *unix
	} else {
		ln, err = net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
		if err == nil {
			where = "http://" + ln.Addr().String()
		}
	}
	if err != nil {
		log.Fatalf("listen: %v", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("/", records)
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx) // also removes the Unix socket file
	}()

	fmt.Printf("order service listening on %s (sidecar API %s)\n", where, sidecarAPI)
	if err := server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("serve: %v", err)
	}
}
