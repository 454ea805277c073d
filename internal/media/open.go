package media

import "github.com/buzzrelay/buzz/internal/config"

// OpenStore opens the object store the settings name: S3 with
// BUZZ_MEDIA_STORE=s3, else files under BUZZ_MEDIA_DIR; nil when media is
// off (the filesystem store without a directory). The relay and buzz-admin
// open the same store through it.
func OpenStore(cfg config.Config) (Store, error) {
	if cfg.MediaStore == "s3" {
		s, err := NewS3Store(S3Config{
			Endpoint: cfg.MediaS3Endpoint, Bucket: cfg.MediaS3Bucket,
			AccessKey: cfg.MediaS3AccessKey, SecretKey: cfg.MediaS3SecretKey,
			Region: cfg.MediaS3Region, UseTLS: cfg.MediaS3TLS,
		})
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	if cfg.MediaDir == "" {
		return nil, nil
	}
	s, err := NewFSStore(cfg.MediaDir)
	if err != nil {
		return nil, err
	}
	return s, nil
}
