package platform

import "time"

// Poll calls try until it reports done or an error, for up to d, pausing between calls for a
// millisecond at first and twice as long each time after, up to maxPause. It reports whether
// try said done; once d has passed it returns false after one last call. waiting, unless nil,
// is called once, before the first pause. It is for conditions no descriptor can be waited on
// for (a flock without a bound, a loop device going), which a wait must still bound.
func Poll(d, maxPause time.Duration, waiting func(), try func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; ; pause = min(2*pause, maxPause) {
		done, err := try()
		if done || err != nil {
			return done, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		time.Sleep(min(pause, left))
	}
}
